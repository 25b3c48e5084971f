"""dynemb's import graph: no cycle, counting what Python runs on an import (a package's
``__init__``) too; no function-level import of dynemb's own modules; the front (DynamicEmb's
module paths, ``dynemb/__init__.py``) imported by no module behind it. ``make lint``
checks the front by import-linter's contracts (pyproject.toml); these tests check the
graph those contracts cannot, with the functions of tools/import_graph.py."""

import grimp
import pytest

from tests.support.import_graph import import_graph

pytestmark = pytest.mark.no_emulated_pass("reads the sources' imports; runs no table op")


@pytest.fixture(scope="module")
def graph():
    built = grimp.build_graph("dynemb", exclude_type_checking_imports=True, cache_dir=None)
    import_graph.drop_extension_imports(built)
    return built


def _described(components) -> list[str]:
    return [" ".join(sorted(c)) for c in components]


def test_no_import_cycle(graph):
    assert not _described(import_graph.cycles(graph))


def test_no_import_cycle_through_package_inits(graph):
    # Importing dynemb.a.b runs dynemb/a/__init__.py first: a package that re-exports
    # pulls its modules in, and a module below it that imports one of them (e.g.
    # dynemb.table importing dynemb.tiering.x, while dynemb.tiering re-exports a module
    # that imports dynemb.table) fails on a partially initialised module.
    with_inits = grimp.build_graph("dynemb", exclude_type_checking_imports=True, cache_dir=None)
    import_graph.drop_extension_imports(with_inits)
    import_graph.add_package_imports(with_inits)
    assert not _described(import_graph.cycles(with_inits))


def test_no_function_level_import_of_dynemb():
    # A lazy import of an optional dependency is fine (with a comment saying so); one
    # of dynemb's own modules would hide a cycle.
    found = [entry for entry in import_graph.function_imports() if entry[2].startswith("dynemb")]
    assert not found


def test_front_is_imported_by_no_module_behind_it(graph):
    assert not import_graph.front_imports(graph)


def test_front_contract_lets_the_front_import_itself():
    # pyproject.toml's contract lists the front twice: what it protects, who may import it.
    assert sorted(import_graph.FRONT_IMPORTERS) == sorted(import_graph.FRONT)


def test_front_only_re_exports():
    assert not import_graph.front_definitions()


def test_no_isinstance_on_tbe_classes():
    # Models are walked through dynemb.table_groups' protocol, not by class.
    assert not import_graph.tbe_isinstance()


def test_cycle_finder_finds_cycles():
    made = grimp.ImportGraph()
    for importer, imported in [("p.a", "p.b"), ("p.b", "p.c"), ("p.c", "p.a"), ("p.c", "p.d")]:
        made.add_import(importer=importer, imported=imported)
    assert _described(import_graph.cycles(made)) == ["p.a p.b p.c"]
    inits = grimp.ImportGraph()
    inits.add_module("p.q")
    for importer, imported in [("p.q", "p.q.x"), ("p.q.x", "p.t"), ("p.t", "p.q.y")]:
        inits.add_import(importer=importer, imported=imported)
    assert not import_graph.cycles(inits)
    import_graph.add_package_imports(inits)  # p.t -> p.q.y runs p.q first
    assert _described(import_graph.cycles(inits)) == ["p.q p.q.x p.t"]
