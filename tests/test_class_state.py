"""Classes own their state: no module of dynemb reads another object's private
attribute, and no class is assembled from several dynemb classes sharing private
state (mixins). Parts a class needs are objects it holds, given their state
explicitly (e.g. ``CachedTable.filler`` over a ``CacheState``), or functions it hands
its state to (``ScoredHashTable``'s ``TableState``).

Both checks read the source (``ast``), importing nothing."""

import ast
import pathlib

import pytest

pytestmark = pytest.mark.no_emulated_pass("reads the source; runs no table op")

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "dynemb"

# Private attributes of objects dynemb does not own that it must read, by
# (file under dynemb/, expression): why.
ALLOWED_PRIVATE_READS = {
    ("config/table_options.py", "other._key"): "__eq__ compares two options of its own class",
    ("distributed/rank_faults.py", "dist.distributed_c10d._get_default_store"): (
        "torch offers no public getter of the default c10d store"
    ),
    ("emulated_streams.py", "func._schema"): "an OpOverload's schema (torch's only accessor)",
    ("shard/ordinary_state.py", "ShardedTensor._init_from_local_shards_and_global_metadata"): (
        "how TorchRec builds its tables' ShardedTensor state"
    ),
    ("shard/output_dist.py", "inner._features_per_sharding"): "no public accessor in TorchRec",
    ("shard/output_dist.py", "inner._awaitables_per_sharding"): "no public accessor in TorchRec",
    ("shard/output_dist.py", "inner._embedding_names_per_sharding"): (
        "no public accessor in TorchRec"
    ),
    ("shard/rw_sharding.py", "lookup._feature_splits"): "no public accessor in TorchRec",
    ("shard/rw_sharding.py", "lookup._emb_modules"): "no public accessor in TorchRec",
}
# namedtuple's API is spelt with an underscore
NAMEDTUPLE_METHODS = {"_replace", "_asdict", "_fields", "_make", "_field_defaults"}
# TorchRec's classes are built by subclassing with mixins (its design), under shard/.
MIXINS_ALLOWED_UNDER = ("shard/",)


def _sources() -> dict[str, ast.Module]:
    return {
        str(p.relative_to(PACKAGE)): ast.parse(p.read_text(), str(p))
        for p in sorted(PACKAGE.rglob("*.py"))
    }


def private_reads(tree: ast.AST) -> list[tuple[int, str]]:
    """``(line, expression)`` of each private attribute read on something other than
    ``self`` / ``cls`` / ``super()``: another object's (dunders and namedtuple's
    methods excepted)."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        name = node.attr
        if not name.startswith("_") or (name.startswith("__") and name.endswith("__")):
            continue
        if name in NAMEDTUPLE_METHODS:
            continue
        owner = node.value
        if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
            continue
        if (
            isinstance(owner, ast.Call)
            and isinstance(owner.func, ast.Name)
            and owner.func.id == "super"
        ):
            continue
        found.append((node.lineno, ast.unparse(node)))
    return found


def _module_of(path: str) -> str:
    parts = pathlib.PurePosixPath(path).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(("dynemb", *parts))


def _is_interface(cls: ast.ClassDef) -> bool:
    """An ABC or a Protocol: an interface, which implementations may add to a base."""
    for base in cls.bases:
        text = ast.unparse(base)
        if text in ("ABC", "abc.ABC", "Protocol", "typing.Protocol") or text.startswith(
            ("Protocol[", "typing.Protocol[")
        ):
            return True
    return any(
        kw.arg == "metaclass" and ast.unparse(kw.value) in ("ABCMeta", "abc.ABCMeta")
        for kw in cls.keywords
    )


def _resolve(base: ast.expr, names: dict) -> tuple[str, str] | None:
    """``(module, class name)`` a base expression names, through ``names`` (a module's
    classes and ``from`` imports); None when it names none of them."""
    if isinstance(base, ast.Name) and base.id in names:
        return names[base.id]
    if isinstance(base, ast.Attribute) and isinstance(base.value, ast.Name):
        if base.value.id in names:  # `from dynemb.table import protocol`, `protocol.Table`
            owner, sub = names[base.value.id]
            return (f"{owner}.{sub}", base.attr)
    return None


def dynemb_bases(sources: dict[str, ast.Module]) -> dict[tuple[str, str], list[str]]:
    """Per class ``(file, name)``: its bases that are classes of dynemb and not
    interfaces (resolved through the module's own classes and its imports)."""
    classes = {}  # (module, class name) -> ClassDef
    for path, tree in sources.items():
        for node in tree.body:
            if isinstance(node, ast.ClassDef):
                classes[(_module_of(path), node.name)] = node
    result = {}
    for path, tree in sources.items():
        module = _module_of(path)
        names = {}  # a name bound in this module -> (module, name) it stands for
        for node in tree.body:
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    bound = alias.asname or alias.name
                    names[bound] = (node.module, alias.name)
            elif isinstance(node, ast.ClassDef):
                names[node.name] = (module, node.name)

        for node in ast.walk(tree):
            if not isinstance(node, ast.ClassDef):
                continue
            ours = []
            for base in node.bases:
                key = _resolve(base, names)
                if key is None or not key[0].startswith("dynemb"):
                    continue
                target = classes.get(key)
                if target is not None and _is_interface(target):
                    continue
                ours.append(ast.unparse(base))
            result[(path, node.name)] = ours
    return result


def test_no_module_reads_another_objects_private_attributes():
    sources = _sources()
    seen = set()
    reads = []
    for path, tree in sources.items():
        for line, expr in private_reads(tree):
            if (path, expr) in ALLOWED_PRIVATE_READS:
                seen.add((path, expr))
            else:
                reads.append(f"dynemb/{path}:{line}: {expr}")
    assert not reads, (
        "these read another object's private attribute; give its owner a public method "
        "or property (or, for torch / TorchRec internals, add the read to "
        f"ALLOWED_PRIVATE_READS with the reason): {reads}"
    )
    stale = set(ALLOWED_PRIVATE_READS) - seen
    assert not stale, f"ALLOWED_PRIVATE_READS names reads that no longer exist: {stale}"


def test_no_class_mixes_several_dynemb_classes():
    mixed = {
        f"dynemb/{path}::{name}": bases
        for (path, name), bases in dynemb_bases(_sources()).items()
        if len(bases) > 1 and not path.startswith(MIXINS_ALLOWED_UNDER)
    }
    assert not mixed, (
        "these classes are assembled from several dynemb classes (mixins sharing "
        "state); hold the parts as objects given their state instead: "
        f"{mixed}"
    )


def test_the_checks_find_what_they_look_for():
    """The checks fail on a mixin and on a read of another object's private
    attribute, and pass the reads of one's own."""
    tree = ast.parse(
        "class A:\n    def f(self, other):\n"
        "        return self._x + other._y + super()._z + p._replace(a=1)._w\n"
    )
    assert sorted(expr for _, expr in private_reads(tree)) == ["other._y", "p._replace(a=1)._w"]
    sources = {
        "parts.py": ast.parse("import abc\nclass P:\n    pass\nclass Q:\n    pass\n"
                              "class I(abc.ABC):\n    pass\n"),
        "whole.py": ast.parse("from dynemb.parts import P, Q, I\nfrom torch import nn\n"
                              "class W(P, Q, nn.Module):\n    pass\n"
                              "class V(P, I):\n    pass\n"),
    }  # fmt: skip
    bases = dynemb_bases(sources)
    assert bases[("whole.py", "W")] == ["P", "Q"]
    assert bases[("whole.py", "V")] == ["P"]  # an interface is no mixin
