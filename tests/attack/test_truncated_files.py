"""Every reader of headerless files refuses a file whose size is not what its layout
implies, naming the file, its size and the size expected, before anything changes:
admission counter files (a 12-byte key file is refused, not read as one key),
DynamicEmb's layout (loads and warm starts), and the buffers of a flushed spill
directory (a reopen must neither truncate nor extend them)."""

import gc
import os
import re
from pathlib import Path

import pytest
import torch

from dynemb import (
    BatchedDynamicEmbeddingTables,
    CheckpointError,
    DynamicEmbDump,
    DynamicEmbLoad,
    DynamicEmbTableOptions,
    FrequencyAdmissionStrategy,
    KVCounter,
    ScoredHashTable,
)
from dynemb.embedding_admission import MultiTableKVCounter
from dynemb.warm_start import WarmStart

# ------------------------------------------------------------------ counter files


def _counter() -> MultiTableKVCounter:
    counter = MultiTableKVCounter([KVCounter(1024)], torch.device("cpu"))
    counter.add(torch.tensor([5, 6, 6]), torch.tensor([0, 0, 0]))
    return counter


def _counts(counter: MultiTableKVCounter) -> dict:
    keys, counts = counter.counters[0].dump()
    return dict(zip(keys.tolist(), counts.tolist(), strict=True))


def _write(file: Path, values: list, extra: bytes = b"") -> Path:
    file.write_bytes(torch.tensor(values, dtype=torch.int64).numpy().tobytes() + extra)
    return file


@pytest.mark.parametrize(
    "keys, counts, bad, message",
    [
        ([7], [1], "keys", r"`key_file` {keys} holds 12 bytes, expected a multiple of 8 .*8 or 16"),
        ([7, 8], [1, 2, 3], "counts", r"`counter_file` {counts} holds 24 bytes, expected 16"),
        ([7, 8], [1], "counts", r"`counter_file` {counts} holds 8 bytes, expected 16"),
    ],
    ids=["a 12-byte key file", "a count too many", "a count too few"],
)  # fmt: skip
def test_a_counter_file_of_the_wrong_size_is_refused(tmp_path, keys, counts, bad, message):
    files = {
        "keys": _write(tmp_path / "keys", keys, b"\0" * 4 if bad == "keys" else b""),
        "counts": _write(tmp_path / "counts", counts),
    }
    counter = _counter()
    before = _counts(counter)
    message = message.format(**{k: re.escape(str(f)) for k, f in files.items()})
    with pytest.raises(ValueError, match=message):
        counter.load(files["keys"], files["counts"], table_id=0)
    assert _counts(counter) == before


# ------------------------------------------------------------------ DynamicEmb's layout


def _module() -> BatchedDynamicEmbeddingTables:
    options = DynamicEmbTableOptions(
        dim=4,
        max_capacity=256,
        admit_strategy=FrequencyAdmissionStrategy(
            threshold=2, counter=KVCounter(capacity=64, bucket_capacity=16)
        ),
    )
    return BatchedDynamicEmbeddingTables([options], [0], table_names=["t"])


def _train(module, keys: torch.Tensor) -> None:
    module(keys, torch.arange(keys.numel() + 1)).sum().backward()


def _stored(module) -> tuple:
    keys, values, scores, _ = module.tables[0].export_batch(0, module.tables[0].capacity())
    order = torch.argsort(keys)
    return keys[order], values[order], scores[order]


def _dumped(tmp_path) -> Path:
    trained = _module()
    keys = torch.arange(1, 33)
    _train(trained, keys)
    _train(trained, keys[:16])  # 1..16 stored, 17..32 counted only
    DynamicEmbDump(tmp_path / "ckpt", trained, format="dynamicemb", counter=True)
    return tmp_path / "ckpt" / "model"


def _resize(file: Path, delta: int) -> tuple[int, int]:
    size = file.stat().st_size
    os.truncate(file, size + delta)
    return size + delta, size


LAYOUT_CASES = {  # file stem -> how the message gives the size expected
    "emb_keys": "a multiple of 8",
    "emb_values": "{size}",
    "emb_scores": "{size}",
    "counter_keys": "a multiple of 8",
    "counter_frequencies": "{size}",
}


@pytest.mark.parametrize("delta", [-4, 4], ids=["truncated", "extended"])
@pytest.mark.parametrize("stem", LAYOUT_CASES)
def test_a_dynamicemb_layout_file_of_the_wrong_size_is_refused(tmp_path, stem, delta):
    directory = _dumped(tmp_path)
    file = directory / f"t_{stem}.rank_0.world_size_1"
    got, size = _resize(file, delta)
    module = _module()
    _train(module, torch.tensor([100, 101, 100, 101]))
    before = _stored(module)
    expected = LAYOUT_CASES[stem].format(size=size)
    with pytest.raises(CheckpointError, match=rf"{re.escape(str(file))}: {got} bytes, expected "):
        DynamicEmbLoad(tmp_path / "ckpt", module, counter=True)
    with pytest.raises(CheckpointError, match=rf"{got} bytes, expected {expected}"):
        DynamicEmbLoad(tmp_path / "ckpt", module, counter=True)
    for a, b in zip(before, _stored(module), strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("delta", [-4, 4], ids=["truncated", "extended"])
@pytest.mark.parametrize("stem", ["emb_keys", "emb_values", "emb_scores"])
def test_a_warm_start_from_a_file_of_the_wrong_size_is_refused(tmp_path, stem, delta):
    file = _dumped(tmp_path) / f"t_{stem}.rank_0.world_size_1"
    got, _ = _resize(file, delta)
    with pytest.raises(CheckpointError, match=rf"{re.escape(str(file))}: {got} bytes, expected"):
        WarmStart.from_dump(tmp_path / "ckpt", "t")


# ------------------------------------------------------------------ spill directories


def _spill_table(path: str) -> ScoredHashTable:
    return ScoredHashTable(dim=4, capacity=1024, bucket_capacity=16, spill_directory=path)


def _files(path: str) -> dict[str, bytes]:
    """Every file of the directory but its lock: relative path -> content."""
    out = {}
    for root, _, names in os.walk(path):
        for name in names:
            full = os.path.join(root, name)
            if name != "lock":
                out[os.path.relpath(full, path)] = Path(full).read_bytes()
    return out


@pytest.mark.parametrize("change", ["truncated", "extended", "missing"])
def test_a_spill_buffer_of_the_wrong_size_is_refused_on_reopen(tmp_path, change):
    path = str(tmp_path / "table")
    table = _spill_table(path)
    table.find_or_insert(torch.arange(100))
    table.flush()
    keys = torch.sort(table.export_batch(0, table.capacity())[0]).values
    del table
    gc.collect()
    intact = _files(path)
    buffers = [name for name, content in intact.items() if name.startswith("g") and content]
    assert len(buffers) >= 3  # digests, keys, scores, ... (which depends on the executor)
    for name in buffers:
        file = os.path.join(path, name)
        size = len(intact[name])
        if change == "missing":
            os.remove(file)
            message = rf"{re.escape(file)}: missing, expected {size} bytes"
        else:
            got = size - 1 if change == "truncated" else size + 8
            os.truncate(file, got)
            message = rf"{re.escape(file)}: {got} bytes, expected {size}"
        damaged = _files(path)
        with pytest.raises(ValueError, match=rf"spill directory .*{message}"):
            _spill_table(path)
        gc.collect()
        assert _files(path) == damaged  # the reopen neither truncated nor extended anything
        Path(file).write_bytes(intact[name])
    reopened = _spill_table(path)  # the repaired directory reopens as the same table
    assert torch.equal(torch.sort(reopened.export_batch(0, reopened.capacity())[0]).values, keys)
