"""Checkpoints refuse bad files loudly and survive a kill -9 in the middle of a dump."""

import json
import os
import random
import signal
import time

import pytest
import torch

from dynemb import BatchedDynamicEmbeddingTables, DynamicEmbTableOptions
from dynemb.checkpoint import CheckpointError, DynamicEmbDump, DynamicEmbLoad
from dynemb.checkpoint.writer import committed_dump
from dynemb.dump_files import verify as verify_module
from dynemb.dump_files.manifest import checksum
from dynemb.optimizer import EmbOptimType
from tests.support.checkpoint_tables import contents as _contents
from tests.support.checkpoint_tables import make_module as _module
from tests.support.checkpoint_tables import same as _same
from tests.support.checkpoint_tables import train as _train


@pytest.fixture
def checkpoint(tmp_path):
    module = _module()
    _train(module, torch.arange(-300, 300))
    path = tmp_path / "ckpt"
    DynamicEmbDump(path, module, optim=True)
    return path, _contents(module)


def _target():
    """A module that already holds rows: a failed load must leave them as they are."""
    module = _module()
    _train(module, torch.arange(1000, 1010))
    return module, _contents(module)


def _file(path, table: str, field: str):
    return path / committed_dump(path) / f"{table}.r0.{field}"


def test_round_trip_restores_rows_state_and_exact_lfu_counts(checkpoint):
    path, saved = checkpoint
    module = _module()
    DynamicEmbLoad(path, module, optim=True)
    assert _same(_contents(module), saved)


@pytest.mark.parametrize("cut", [0, 1, 0.5, -1])
def test_truncated_file_is_refused_and_tables_unchanged(checkpoint, cut):
    path, _ = checkpoint
    file = _file(path, "a", "values")
    size = file.stat().st_size
    keep = {0: 0, 1: 1, 0.5: size // 2, -1: size - 1}[cut]
    with open(file, "r+b") as f:
        f.truncate(keep)
    module, before = _target()
    with pytest.raises(CheckpointError, match=f"{file.name}.*truncated"):
        DynamicEmbLoad(path, module, optim=True)
    assert _same(_contents(module), before)


@pytest.mark.parametrize("field", ["keys", "values", "state", "scores"])
def test_flipped_byte_is_a_checksum_error(checkpoint, field):
    path, _ = checkpoint
    file = _file(path, "b", field)
    data = bytearray(file.read_bytes())
    data[len(data) // 3] ^= 0x40
    file.write_bytes(bytes(data))
    module, before = _target()
    with pytest.raises(CheckpointError, match=f"{file.name}: checksum mismatch"):
        DynamicEmbLoad(path, module, optim=True)
    assert _same(_contents(module), before)


@pytest.mark.parametrize("where", [0.1, 0.5, 0.99])
def test_files_checked_in_pieces_catch_a_flip_in_any_piece(checkpoint, monkeypatch, where):
    """Big files are checked as pieces on two threads; their CRCs combine exactly."""
    monkeypatch.setattr(verify_module, "_VERIFY_PIECE", 1000)  # many pieces per file
    path, saved = checkpoint
    module = _module()
    DynamicEmbLoad(path, module, optim=True)
    assert _same(_contents(module), saved)
    file = _file(path, "a", "state")
    data = bytearray(file.read_bytes())
    assert len(data) > 10 * 1000
    data[int(len(data) * where)] ^= 0x01
    file.write_bytes(bytes(data))
    module, before = _target()
    with pytest.raises(CheckpointError, match=f"{file.name}: checksum mismatch"):
        DynamicEmbLoad(path, module, optim=True)
    assert _same(_contents(module), before)


def test_missing_file_is_named(checkpoint):
    path, _ = checkpoint
    file = _file(path, "a", "scores")
    file.unlink()
    with pytest.raises(CheckpointError, match=f"{file.name}: missing"):
        DynamicEmbLoad(path, _module(), optim=True)


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda m: m.update(version=99), "format version 99"),
        (lambda m: m["tables"]["a"].update(dim=16), "table 'a': the checkpoint has dim=16"),
        (lambda m: m["tables"]["b"].update(value_dtype="float16"), "value_dtype='float16'"),
        (lambda m: m["tables"]["a"].update(optimizer="EXACT_ADAGRAD"), "EXACT_ADAGRAD state"),
    ],
)
def test_manifest_mismatches_are_refused(checkpoint, edit, message):
    path, _ = checkpoint
    manifest = json.loads((path / "manifest.json").read_text())
    edit(manifest)
    manifest["checksum"] = checksum(manifest)  # consistent edits: the options are checked
    (path / "manifest.json").write_text(json.dumps(manifest))
    module, before = _target()
    with pytest.raises(CheckpointError, match=message):
        DynamicEmbLoad(path, module, optim=True)
    assert _same(_contents(module), before)


def test_optimizer_without_state_round_trips(tmp_path):
    """SGD keeps no state columns: optim=True writes empty state files and loads them."""
    module = _module(optimizer=EmbOptimType.EXACT_SGD)
    _train(module, torch.arange(-50, 50))
    DynamicEmbDump(tmp_path / "ckpt", module, optim=True)
    loaded = _module(optimizer=EmbOptimType.EXACT_SGD)
    DynamicEmbLoad(tmp_path / "ckpt", loaded, optim=True)
    assert _same(_contents(loaded), _contents(module))


def test_other_optimizer_loads_rows_only_when_asked(checkpoint):
    path, saved = checkpoint
    module = _module(optimizer=EmbOptimType.EXACT_SGD)
    with pytest.raises(CheckpointError, match="allow_optimizer_mismatch"):
        DynamicEmbLoad(path, module, optim=True)
    DynamicEmbLoad(path, module, optim=True, allow_optimizer_mismatch=True)
    got = _contents(module)
    for (k, rows, s), (wk, wrows, ws) in zip(got, saved, strict=True):
        assert torch.equal(k, wk) and torch.equal(s, ws)
        assert torch.equal(rows, wrows[:, : rows.shape[1]])


def test_unknown_names_and_non_checkpoints(checkpoint, tmp_path):
    path, _ = checkpoint
    with pytest.raises(ValueError, match="'zz' is not a dynamic table"):
        DynamicEmbLoad(path, _module(), table_names=["zz"])
    with pytest.raises(CheckpointError, match="no manifest"):
        DynamicEmbLoad(tmp_path, _module())
    with pytest.raises(CheckpointError, match="dumped without optimizer state"):
        plain = tmp_path / "plain"
        DynamicEmbDump(plain, _module())
        DynamicEmbLoad(plain, _module(), optim=True)


@pytest.mark.no_emulated_pass(
    "the dump's commit protocol under SIGKILL: the files, not the executor, are under test"
)
def test_kill_9_during_dump_never_breaks_the_previous_checkpoint(tmp_path):
    """A dump killed at 20 random moments: the checkpoint always loads, bit-exact, as
    either the previous dump or (if the kill came after the commit) the new one; a
    dump directory the manifest does not name is never loadable."""
    module = _module(dim=32, capacity=1 << 17)
    _train(module, torch.arange(0, 60_000))
    path = tmp_path / "ckpt"
    DynamicEmbDump(path, module, optim=True)
    previous = _contents(module)
    _train(module, torch.arange(30_000, 90_000))
    current = _contents(module)

    def dump_in_child() -> int:
        pid = os.fork()
        if pid == 0:  # the child: dump, then leave without any cleanup
            try:
                torch.set_num_threads(1)
                DynamicEmbDump(path, module, optim=True)
            finally:
                os._exit(0)
        return pid

    start = time.monotonic()
    os.waitpid(dump_in_child(), 0)  # one whole dump, to time it
    duration = time.monotonic() - start
    rng = random.Random(0)
    outcomes = set()
    for _ in range(20):
        pid = dump_in_child()
        time.sleep(rng.uniform(0, duration))
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        loaded = _module(dim=32, capacity=1 << 17)
        DynamicEmbLoad(path, loaded, optim=True)
        got = _contents(loaded)
        assert _same(got, previous) or _same(got, current)
        outcomes.add(_same(got, current))
        for partial in path.iterdir():
            if partial.is_dir() and partial.name != committed_dump(path):
                with pytest.raises(CheckpointError, match="no manifest"):
                    DynamicEmbLoad(partial, _module(dim=32, capacity=1 << 17))
    assert outcomes  # at least one load happened per kill


def test_admission_counts_survive_a_checkpoint(tmp_path):
    from dynemb.admission_strategies import FrequencyAdmissionStrategy, KVCounter

    def module():
        options = DynamicEmbTableOptions(
            dim=4,
            max_capacity=1024,
            admit_strategy=FrequencyAdmissionStrategy(
                threshold=3, counter=KVCounter(capacity=1024)
            ),
        )
        return BatchedDynamicEmbeddingTables([options], [0], table_names=["t"])

    a = module()
    for keys in ([1, 2, 2], [1, 3]):  # counts: 1 -> 2, 2 -> 2, 3 -> 1; nothing admitted
        _train(a, torch.tensor(keys))
    assert a.tables[0].size() == 0
    DynamicEmbDump(tmp_path / "ckpt", a, counter=True)
    c = module()
    DynamicEmbLoad(tmp_path / "ckpt", c)  # counter=False: the counts stay out
    assert c.admission_counters[0].dump()[0].numel() == 0
    b = module()
    DynamicEmbLoad(tmp_path / "ckpt", b, counter=True)
    keys, counts = b.admission_counters[0].dump()
    assert dict(zip(keys.tolist(), counts.tolist())) == {1: 2, 2: 2, 3: 1}
    _train(b, torch.tensor([1, 2, 3]))  # 1 and 2 reach 3: admitted; 3 is not
    assert sorted(b.tables[0].export_batch(0, 1024)[0].tolist()) == [1, 2]


def test_table_names_dump_and_load_a_subset(tmp_path):
    module = _module()
    _train(module, torch.arange(0, 40))
    DynamicEmbDump(tmp_path / "ckpt", module, table_names=["b"], optim=True)
    manifest = json.loads((tmp_path / "ckpt" / "manifest.json").read_text())
    assert sorted(manifest["tables"]) == ["b"]
    with pytest.raises(CheckpointError, match=r"no saved table \['a'\]"):
        DynamicEmbLoad(tmp_path / "ckpt", _module(), optim=True)  # 'a' is not in it
    target = _module()
    DynamicEmbLoad(tmp_path / "ckpt", target, table_names=["b"], optim=True)
    assert _same(_contents(target)[1:], _contents(module)[1:])
    assert target.tables[0].size() == 0
