"""A damaged or hostile checkpoint is refused before any table changes: the manifest's
checksum, its schema (types, ranges, every table and file present), file paths that stay
inside the checkpoint, and decoding errors that name the file."""

import json
import os

import pytest
import torch

from dynemb.checkpoint import CheckpointError, DynamicEmbDump, DynamicEmbLoad
from dynemb.checkpoint.writer import committed_dump
from tests.support.checkpoint_tables import contents, edit_manifest, make_module, same, train

pytestmark = pytest.mark.no_emulated_pass("manifest validation: Python only")


@pytest.fixture
def checkpoint(tmp_path):
    module = make_module()
    train(module, torch.arange(-300, 300))
    path = tmp_path / "ckpt"
    DynamicEmbDump(path, module, optim=True)
    return path, contents(module)


def _target():
    """A module that already holds rows: a refused load must leave them as they are."""
    module = make_module()
    train(module, torch.arange(1000, 1010))
    return module, contents(module)


def _refused(path, match: str) -> None:
    module, before = _target()
    with pytest.raises(CheckpointError, match=match):
        DynamicEmbLoad(path, module, optim=True)
    assert same(contents(module), before), "a refused load changed the tables"
    assert module.step > 0 and module.tables[0].score_step >= 0


def _set(table: str, field: str, value):
    return lambda m: m["tables"][table].__setitem__(field, value)


def _entry(table: str, field: str, name):
    return lambda m: m["tables"][table]["files"][0]["fields"][field].__setitem__("file", name)


def test_a_damaged_manifest_fails_its_checksum(checkpoint):
    path, _ = checkpoint
    edit_manifest(path, _set("a", "table_step", 7), rehash=False)
    _refused(path, r"manifest.json: checksum .* damaged or was edited")


def test_non_utf8_manifest_names_the_file(checkpoint):
    path, _ = checkpoint
    raw = (path / "manifest.json").read_bytes()
    (path / "manifest.json").write_bytes(raw[:40] + b"\xff\xfe" + raw[40:])
    _refused(path, r"manifest.json: not UTF-8")


def test_truncated_manifest_names_the_file(checkpoint):
    path, _ = checkpoint
    raw = (path / "manifest.json").read_bytes()
    (path / "manifest.json").write_bytes(raw[: len(raw) // 2])
    _refused(path, r"manifest.json: unreadable manifest")


@pytest.mark.parametrize(
    "edit, message",
    [
        (_set("a", "table_step", "5"), r"tables\['a'\]\.table_step must be an integer"),
        (_set("b", "optimizer_step", "x"), r"tables\['b'\]\.optimizer_step must be an integer"),
        (_set("a", "optimizer_step", 2**70), r"optimizer_step must be an integer in \[0, 9223"),
        (_set("a", "optimizer_step", -1), r"optimizer_step must be an integer in \[0"),
        (_set("a", "dim", True), r"tables\['a'\]\.dim must be an integer"),
        (_set("a", "files", []), r"tables\['a'\]\.files must be a list of one entry per saved"),
        (_set("a", "value_dtype", "int8"), r"value_dtype must be float32, float16 or bfloat16"),
        (_set("a", "dist_type", "nope"), r"dist_type must be one of"),
        (
            lambda m: m["tables"]["a"].__setitem__(
                "tabel_step", m["tables"]["a"].pop("table_step")
            ),
            r"tables\['a'\] must be an object with keys",
        ),
        (lambda m: m.pop("optim"), r"the manifest must be an object with keys"),
        (lambda m: m.update(optim="yes"), r"optim must be true or false"),
        (lambda m: m.update(tables=[]), r"tables must be a JSON object"),
        (lambda m: m.update(dump_id="../elsewhere"), r"dump_id must be a dump directory name"),
        (lambda m: m.update(dump_id="/tmp"), r"dump_id must be a dump directory name"),
        (
            lambda m: m["tables"]["a"]["files"][0]["fields"].pop("scores"),
            r"files\[0\]\.fields must be an object with at least",
        ),
        (
            lambda m: m["tables"]["a"]["files"][0].update(rows=-3),
            r"files\[0\]\.rows must be an integer in \[0",
        ),
        (
            lambda m: m["tables"]["a"]["files"][0].update(rank=1),
            r"files\[0\]\.rank must be an integer in \[0, 0\]",
        ),
        (
            lambda m: m["tables"]["a"]["files"][0]["fields"]["keys"].update(crc32=1 << 40),
            r"fields\.keys\.crc32 must be an integer in \[0, 4294967295\]",
        ),
        (_entry("a", "keys", "/etc/passwd"), r"fields\.keys\.file must be a plain file name"),
        (_entry("a", "values", "../../x"), r"fields\.values\.file must be a plain file name"),
        (_entry("b", "scores", "."), r"fields\.scores\.file must be a plain file name"),
        (lambda m: m["tables"].update({"a/b": m["tables"]["a"]}), r"a table name must be"),
    ],
)
def test_invalid_fields_are_refused_before_any_change(checkpoint, edit, message):
    """Each edit keeps a valid checksum (a hostile writer recomputes it): the schema
    must refuse it, naming the manifest, the field and the value."""
    path, _ = checkpoint
    edit_manifest(path, edit)
    _refused(path, r"manifest.json: (.*)?" + message)


def test_a_file_linked_out_of_the_checkpoint_is_refused(checkpoint, tmp_path):
    """A data file that is a symbolic link to a file outside the checkpoint (with the
    right size and checksum) is never read."""
    path, _ = checkpoint
    file = path / committed_dump(path) / "a.r0.keys"
    outside = tmp_path / "outside.keys"
    outside.write_bytes(file.read_bytes())
    file.unlink()
    os.symlink(outside, file)
    _refused(path, r"a.r0.keys: leads to .*outside.keys, outside the checkpoint")


def test_a_version_1_manifest_without_checksum_still_loads(checkpoint):
    path, saved = checkpoint

    def to_v1(m):
        m.pop("checksum")
        m["version"] = 1

    edit_manifest(path, to_v1, rehash=False)
    module = make_module()
    DynamicEmbLoad(path, module, optim=True)
    assert same(contents(module), saved)


@pytest.mark.parametrize(
    "key, value", [("iters", 2**70), ("iters", -1), ("step_score", "3"), ("iters", 1.5)]
)
def test_dynamicemb_layout_steps_are_checked(tmp_path, key, value):
    """DynamicEmb's opt_args.json: a step that does not fit an int64 is refused by name."""
    module = make_module()
    train(module, torch.arange(0, 40))
    path = tmp_path / "ckpt"
    DynamicEmbDump(path, module, optim=True, format="dynamicemb")
    file = path / "model" / "a_opt_args.json"
    args = json.loads(file.read_text())
    args[key] = value
    file.write_text(json.dumps(args))
    target, before = _target()
    with pytest.raises(CheckpointError, match=rf"a_opt_args.json: {key} must be an integer"):
        DynamicEmbLoad(path, target, optim=True)
    assert same(contents(target), before)


def test_a_file_size_the_manifest_contradicts_is_reported_as_such(checkpoint):
    """Found by tests/checkpoint/test_checkpoint_fuzz.py: a rehashed manifest whose "bytes" disagrees
    with its own row count was reported as "320 bytes, the manifest expects 320"."""
    path, _ = checkpoint
    edit_manifest(path, lambda m: m["tables"]["a"]["files"][0]["fields"]["values"].update(bytes=0))
    _refused(
        path,
        r"a\.r0\.values: the manifest records 0 bytes for it, .* imply \d+: manifest.json is inconsistent",
    )
