"""Fuzzing the checkpoint loader: hypothesis mutates saved checkpoint directories (the
manifest's JSON, data files, DynamicEmb's layout) and every load either restores exactly
what an intact load restores, or raises a ValueError (CheckpointError is one) that names
the damaged file, with the tables unchanged.

Bounded for CI: derandomized (the same examples every run), DYNEMB_FUZZ_EXAMPLES examples
per property (default 200, about 15 s in all).
"""

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dynemb.checkpoint import DynamicEmbDump, DynamicEmbLoad
from dynemb.dump_files.manifest import checksum
from tests.support.checkpoint_tables import contents, make_module, same, train

pytestmark = pytest.mark.no_emulated_pass("file formats: no table op differs per executor")

FUZZ = settings(
    max_examples=int(os.environ.get("DYNEMB_FUZZ_EXAMPLES", "200")),
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)

# Values a hostile or damaged manifest / opt_args.json might hold.
HOSTILE = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=6),
    st.sampled_from(["../a.r0.keys", "/etc/hostname", "a.r0.keys", "b.r0.values", "..", "."]),
    st.just([]),
    st.just({}),
    st.just({"file": "a.r0.keys", "bytes": 1, "crc32": 0}),
)


def _target():
    """A model that already holds rows (a failed load must leave them)."""
    module = make_module(dim=4, capacity=256)
    train(module, torch.arange(1000, 1010))
    return module


def _state(module):
    return contents(module), [t.score_step for t in module.tables], module.step


def _restored(fmt: str, got, expected) -> bool:
    """Keys, rows and scores as an intact load gives them. DynamicEmb's layout stores a
    TIMESTAMP score as an age, which a load turns back into a time relative to now: there
    only keys and rows must match."""
    if fmt == "dynemb":
        return same(got, expected)
    return all(
        torch.equal(g[0], e[0]) and torch.equal(g[1], e[1]) and (i != 0 or torch.equal(g[2], e[2]))
        for i, (g, e) in enumerate(zip(got, expected, strict=True))
    )


def _unchanged(before, after) -> bool:
    return same(before[0], after[0]) and before[1:] == after[1:]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Both formats of one trained model, and what an intact load of each restores."""
    root = tmp_path_factory.mktemp("fuzz")
    module = make_module(dim=4, capacity=256)
    train(module, torch.arange(-20, 20))
    out = {}
    for fmt in ("dynemb", "dynamicemb"):
        path = root / fmt
        DynamicEmbDump(path, module, optim=True, format=fmt)
        target = _target()
        DynamicEmbLoad(path, target, optim=True)
        out[fmt] = (path, contents(target))
    return out


def _load_mutated(fmt: str, source: Path, expected, mutate) -> None:
    """Copies the checkpoint, applies mutate(copy) -> the damaged file's name, loads it."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "ckpt"
        shutil.copytree(source, path, symlinks=True)
        damaged = mutate(path)
        target = _target()
        before = _state(target)
        try:
            DynamicEmbLoad(path, target, optim=True)
        except ValueError as e:
            # The damaged file, or another file of the checkpoint that the damage made
            # inconsistent (a truncated keys file: the values file is then too long), or
            # the checkpoint itself (a table the model has and the checkpoint lacks).
            named = damaged in str(e) or str(path) in str(e)
            assert named, f"the error names neither {damaged} nor the checkpoint: {e}"
            assert _unchanged(before, _state(target)), f"a refused load changed the tables: {e}"
            return
        restored = _restored(fmt, contents(target), expected)
        assert restored, f"a load of damaged {damaged} restored other data"


def _json_paths(node, prefix=()):
    """Every (container path, key) of a JSON document."""
    items = node.items() if isinstance(node, dict) else enumerate(node)
    for key, value in items:
        yield prefix, key
        if isinstance(value, dict | list):
            yield from _json_paths(value, (*prefix, key))


def _mutate_json(doc, where, action: str, value):
    parent = doc
    for key in where[0]:
        parent = parent[key]
    key = where[1]
    if action == "delete":
        del parent[key]
    elif action == "replace":
        parent[key] = value
    elif isinstance(parent, dict):  # "extra": an unknown key beside it
        parent[f"extra_{key}"] = value
    else:
        parent.append(value)


JSON_EDIT = st.tuples(st.sampled_from(["replace", "replace", "delete", "extra"]), HOSTILE)


def _manifest_paths(saved_dir: Path):
    return list(_json_paths(json.loads((saved_dir / "manifest.json").read_text())))


@FUZZ
@given(data=st.data(), edit=JSON_EDIT, rehash=st.sampled_from([True, True, True, False]))
def test_manifest_mutations(saved, data, edit, rehash):
    path, expected = saved["dynemb"]
    where = data.draw(st.sampled_from(_manifest_paths(path)))

    def mutate(copy: Path) -> str:
        file = copy / "manifest.json"
        doc = json.loads(file.read_text())
        _mutate_json(doc, where, *edit)
        if rehash and isinstance(doc, dict):  # a hostile writer fixes the checksum
            doc["checksum"] = checksum(doc)
        file.write_text(json.dumps(doc))
        return "manifest.json"

    _load_mutated("dynemb", path, expected, mutate)


def _data_files(directory: Path) -> list[str]:
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*") if p.is_file())


FILE_DAMAGE = st.one_of(
    st.tuples(st.just("truncate"), st.floats(0.0, 0.999)),
    st.tuples(st.just("flip"), st.tuples(st.floats(0.0, 0.999), st.integers(0, 7))),
    st.tuples(st.just("append"), st.binary(min_size=1, max_size=16)),
    st.tuples(st.just("delete"), st.none()),
    st.tuples(st.sampled_from(["dangling", "loop", "outside"]), st.none()),
)


def _damage(file: Path, damage) -> None:
    kind, arg = damage
    if kind in ("truncate", "flip", "append"):
        raw = bytearray(file.read_bytes())
        if kind == "truncate":
            raw = raw[: int(arg * len(raw))]
        elif kind == "flip" and raw:
            raw[int(arg[0] * len(raw))] ^= 1 << arg[1]
        elif kind == "append":
            raw += arg
        file.write_bytes(bytes(raw))
        return
    file.unlink()
    if kind == "dangling":
        file.symlink_to(file.parent / "no-such-file")
    elif kind == "loop":
        file.symlink_to(file)  # resolving it loops (ELOOP)
    elif kind == "outside":
        file.symlink_to("/etc/hostname")


def _file_property(fmt: str, kinds_excluded=()):
    @FUZZ
    @given(data=st.data(), damage=FILE_DAMAGE.filter(lambda d: d[0] not in kinds_excluded))
    def prop(saved, data, damage):
        path, expected = saved[fmt]
        candidates = [f for f in _data_files(path) if not f.endswith(".lock")]
        if fmt == "dynemb":
            candidates = [f for f in candidates if f != "manifest.json"]
        name = data.draw(st.sampled_from(candidates))

        def mutate(copy: Path) -> str:
            _damage(copy / name, damage)
            return Path(name).name

        _load_mutated(fmt, path, expected, mutate)

    return prop


test_data_file_damage = _file_property("dynemb")
# DynamicEmb's own layout has no checksums: a flipped bit in a row is a different row,
# which no reader can tell from the real one. Everything else must be caught.
test_dynamicemb_layout_damage = _file_property("dynamicemb", kinds_excluded=("flip",))


@FUZZ
@given(data=st.data(), edit=JSON_EDIT)
def test_dynamicemb_opt_args_mutations(saved, data, edit):
    path, expected = saved["dynamicemb"]
    name = data.draw(st.sampled_from([f for f in _data_files(path) if f.endswith(".json")]))
    where = data.draw(st.sampled_from(list(_json_paths(json.loads((path / name).read_text())))))

    def mutate(copy: Path) -> str:
        doc = json.loads((copy / name).read_text())
        _mutate_json(doc, where, *edit)
        (copy / name).write_text(json.dumps(doc))
        return Path(name).name

    _load_mutated("dynamicemb", path, expected, mutate)
