"""Figures of dynemb's import graph: cycles, the front, function-level imports.

Usage: python tools/import_graph.py [--list]

The front is dynemb/__init__.py and DynamicEmb's module paths (FRONT, read from the
import-linter contract `front` of pyproject.toml, the one list of them): they only
re-export, and no other module of dynemb imports them. Imports under TYPE_CHECKING do
not count. --list prints every offending import, not only the counts.
"""

import argparse
import ast
import pathlib
import sys

import grimp

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: import-linter's own TOML reader
    import tomli as tomllib

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _front_contract() -> dict:
    """The import-linter contract ``front`` of pyproject.toml: the one list of the front
    modules (DynamicEmb's module paths and dynemb itself), read here and by the tests."""
    with open(ROOT / "pyproject.toml", "rb") as f:
        contracts = tomllib.load(f)["tool"]["importlinter"]["contracts"]
    return next(c for c in contracts if c["id"] == "front")


FRONT = tuple(_front_contract()["protected_modules"])
# A front module may import another (TOML has no reference: the same list, twice).
FRONT_IMPORTERS = tuple(_front_contract()["allowed_importers"])

# The TBE module classes: a walk over a model finds them by protocol, not by class.
TBE_CLASSES = ("BatchedDynamicEmbeddingTables", "BatchedDynamicEmbeddingTablesV2")


def cycles(graph) -> list[set[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    counter = 0
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append(
                        (child, iter(sorted(graph.find_modules_directly_imported_by(child))))
                    )
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(component)
    return found


def drop_extension_imports(graph) -> None:
    """Removes ``import dynemb._C``: grimp, which sees Python sources only, records an
    import of the compiled extension as one of the package ``dynemb``."""
    for importer in sorted(graph.find_modules_that_directly_import("dynemb")):
        details = graph.get_import_details(importer=importer, imported="dynemb")
        if details and all("_C" in d["line_contents"] for d in details):
            graph.remove_import(importer=importer, imported="dynemb")


def add_package_imports(graph) -> None:
    """Adds what Python does on ``import a.b.c`` from outside ``a.b``: it runs
    ``a/b/__init__.py`` first. A package whose ``__init__`` re-exports makes a cycle of
    its own (``dynemb`` itself is left out: every module is inside it)."""
    for importer in sorted(graph.modules):
        for imported in sorted(graph.find_modules_directly_imported_by(importer)):
            parts = imported.split(".")
            for depth in range(2, len(parts)):
                package = ".".join(parts[:depth])
                if not (importer == package or importer.startswith(package + ".")):
                    graph.add_import(importer=importer, imported=package)


def front_imports(graph) -> list[tuple[str, str]]:
    """(importer, front module) for every import of the front by a module behind it."""
    return sorted(
        (importer, front)
        for front in FRONT
        for importer in graph.find_modules_that_directly_import(front)
        if importer not in FRONT
    )


def _front_file(module: str) -> pathlib.Path:
    path = ROOT / (module.replace(".", "/") + ".py")
    return path if path.exists() else ROOT / module.replace(".", "/") / "__init__.py"


def front_definitions() -> list[tuple[str, int, str]]:
    """(file, line, statement) of every statement of a front module other than its
    docstring, imports and ``__all__``: a front re-exports, it defines nothing."""
    found = []
    for module in FRONT:
        path = _front_file(module)
        for node in ast.parse(path.read_text(), str(path)).body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
                continue
            if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == [
                "__all__"
            ]:
                continue
            found.append((str(path.relative_to(ROOT)), node.lineno, type(node).__name__))
    return found


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def function_imports() -> list[tuple[str, int, str]]:
    """(file, line, imported module) for every import inside a function of dynemb/."""
    found = []
    for path in sorted((ROOT / "dynemb").rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))

        def visit(node, in_function, path=path):
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.If) and _is_type_checking(child):
                    continue
                if in_function and isinstance(child, ast.Import):
                    for alias in child.names:
                        found.append((str(path.relative_to(ROOT)), child.lineno, alias.name))
                elif in_function and isinstance(child, ast.ImportFrom):
                    name = "." * child.level + (child.module or "")
                    found.append((str(path.relative_to(ROOT)), child.lineno, name))
                visit(
                    child,
                    in_function
                    or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)),
                )

        visit(tree, False)
    return found


def tbe_isinstance() -> list[tuple[str, int]]:
    """(file, line) of every isinstance / issubclass check against a TBE module class."""
    found = []
    for path in sorted((ROOT / "dynemb").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in ("isinstance", "issubclass")
                and len(node.args) == 2
                and any(
                    isinstance(n, ast.Name)
                    and n.id in TBE_CLASSES
                    or isinstance(n, ast.Attribute)
                    and n.attr in TBE_CLASSES
                    for n in ast.walk(node.args[1])
                )
            ):
                found.append((str(path.relative_to(ROOT)), node.lineno))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--list", action="store_true", help="print every offending import")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))  # this checkout's dynemb, not an installed one
    graph = grimp.build_graph("dynemb", exclude_type_checking_imports=True, cache_dir=None)
    drop_extension_imports(graph)
    front = front_imports(graph)
    found = cycles(graph)
    add_package_imports(graph)
    found_at_run_time = cycles(graph)
    local = function_imports()
    defined = front_definitions()
    internal = [entry for entry in local if entry[2].startswith(("dynemb", "."))]
    checks = tbe_isinstance()
    print(f"modules: {len(graph.modules)}")
    print(
        f"import cycles (strongly connected components): {len(found)}, sizes {sorted(map(len, found), reverse=True)}"
    )
    print(
        "import cycles counting package __init__ runs: "
        f"{len(found_at_run_time)}, sizes {sorted(map(len, found_at_run_time), reverse=True)}"
    )
    print(
        f"imports of the front by other modules: {len(front)} from {len({i for i, _ in front})} modules"
    )
    print(
        f"definitions in front modules: {len(defined)} in {len({f for f, _, _ in defined})} modules"
    )
    print(f"function-level imports: {len(local)} ({len(internal)} of dynemb's own modules)")
    print(f"isinstance/issubclass on TBE module classes: {len(checks)}")
    if args.list:
        for component in found:
            print("cycle:", " ".join(sorted(component)))
        for component in found_at_run_time:
            print("cycle at run time:", " ".join(sorted(component)))
        for importer, imported in front:
            print(f"front import: {importer} -> {imported}")
        for file, line, kind in defined:
            print(f"front definition: {file}:{line} {kind}")
        for file, line, name in local:
            print(f"function-level import: {file}:{line} {name}")
        for file, line in checks:
            print(f"isinstance: {file}:{line}")


if __name__ == "__main__":
    main()
