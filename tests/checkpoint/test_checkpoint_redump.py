"""Dump -> load into fresh tables -> dump again gives byte-identical data files, in every
storage tier and for empty tables; the two manifests differ only in the fields that
name the dump.

The tiers (dynemb/table/placement.py, dynemb/tiering): every row in device memory;
hybrid (a fast tier in device memory, the rest in the slow tier); the GPU layout's
hybrid (slow tier in host memory, as the emulated CUDA executor places it); spilled
(slot buffers and slow rows in memory-mapped files), alone and hybrid; caching (a
cache in front of a slow tier holding every row).
"""

import filecmp
import json

import pytest
import torch

from dynemb import (
    BatchedDynamicEmbeddingTables,
    DynamicEmbInitializerArgs,
    DynamicEmbPoolingMode,
    DynamicEmbScoreStrategy,
    DynamicEmbTableOptions,
)
from dynemb.checkpoint import DynamicEmbDump, DynamicEmbLoad
from dynemb.checkpoint.writer import committed_dump
from dynemb.optimizer import EmbOptimType
from dynemb.table import placement
from dynemb.tiering import CachedTable

DIM, BAGS = 8, 24
ADAM_COLUMNS = 3 * DIM  # row + Adam's two moments
MAX_ROWS, INIT_ROWS = 1024, 128
TS_LFU = (DynamicEmbScoreStrategy.TIMESTAMP, DynamicEmbScoreStrategy.LFU)
# One table per strategy: LFU counts, timestamps, the compound's timestamps file (a
# cache does not take the compound: STEP scores instead).
STRATEGIES = [DynamicEmbScoreStrategy.LFU, DynamicEmbScoreStrategy.TIMESTAMP, TS_LFU]
TIERS = ["memory", "hybrid", "host_hybrid", "spill", "spill_hybrid", "caching"]

# The manifest fields that must differ between two dumps of the same tables: the dump
# directory's name (a time and a random id) and the checksum, which covers it.
DIFFERING_FIELDS = ("dump_id", "checksum")


def make(tier: str, spill_root, strategies=STRATEGIES) -> BatchedDynamicEmbeddingTables:
    """One table per score strategy, of one feature each, in ``tier``."""
    options = []
    for i, strategy in enumerate(strategies):
        if tier == "caching" and strategy == TS_LFU:
            strategy = DynamicEmbScoreStrategy.STEP
        o = DynamicEmbTableOptions(
            dim=DIM, max_capacity=MAX_ROWS, init_capacity=INIT_ROWS, bucket_capacity=16,
            seed=5 + i, score_strategy=strategy,
            initializer_args=DynamicEmbInitializerArgs(lower=-0.5, upper=0.5),
        )  # fmt: skip
        if tier in ("hybrid", "host_hybrid", "spill_hybrid"):
            o.local_hbm_for_values = 100 * ADAM_COLUMNS * 4  # 100 fast rows
        if tier.startswith("spill"):
            o.spill_directory = str(spill_root)
        if tier == "caching":
            o.caching = True
            o.local_hbm_for_values = 64 * ADAM_COLUMNS * 4  # a 64-row cache
        options.append(o)
    return BatchedDynamicEmbeddingTables(
        options, feature_table_map=list(range(len(options))),
        pooling_mode=DynamicEmbPoolingMode.SUM, optimizer=EmbOptimType.ADAM,
        learning_rate=0.05, table_names=[f"t{i}" for i in range(len(options))],
    )  # fmt: skip


def train(module, steps: int, seed: int, vocab: int, max_bag: int = 5) -> None:
    g = torch.Generator().manual_seed(seed)
    features = len(module.tables)
    for _ in range(steps):
        lengths = torch.randint(0, max_bag, (features * BAGS,), generator=g)
        offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
        ids = torch.randint(0, vocab, (int(lengths.sum()),), generator=g) + seed * (1 << 40)
        out = module(ids * 0x9E3779B97F4A7C15 % (2**61), offsets)  # spread over the key space
        (out * torch.linspace(-1, 1, out.shape[1])).sum().backward()


def fill(module, state: str) -> None:
    """``empty``: nothing; ``trained``: grown past the initial capacity; ``churned``:
    trained, half its keys erased, then trained on new keys until full and evicting."""
    if state == "empty":
        return
    train(module, 6, seed=1, vocab=700)
    for t in module.tables:  # grown past the initial capacity
        table = t.persistent_table()
        assert table.capacity() > INIT_ROWS and table.size() > INIT_ROWS
    if state == "trained":
        return
    for t in module.tables:
        table = t.persistent_table()
        keys, _, _, _ = table.export_batch(0, table.capacity())
        assert t.erase(keys[::2]) == keys[::2].numel()
    train(module, 14, seed=2, vocab=1 << 30, max_bag=9)
    for t in module.tables:  # full: new keys evicted old ones
        table = t.persistent_table()
        assert table.capacity() == MAX_ROWS and table.size() > 0.95 * MAX_ROWS


def dump_load_dump(tmp_path, tier: str, state: str, strategies=STRATEGIES):
    source = make(tier, tmp_path / "spill_a", strategies)
    fill(source, state)
    assert all(isinstance(t, CachedTable) for t in source.tables) == (tier == "caching")
    DynamicEmbDump(tmp_path / "first", source, optim=True)
    fresh = make(tier, tmp_path / "spill_b", strategies)
    DynamicEmbLoad(tmp_path / "first", fresh, optim=True)
    DynamicEmbDump(tmp_path / "second", fresh, optim=True)
    return tmp_path / "first", tmp_path / "second"


def manifest(path) -> dict:
    return json.loads((path / "manifest.json").read_text())


def assert_same_dump(a, b) -> None:
    """Byte-identical data files, and manifests equal but for DIFFERING_FIELDS."""
    da, db = a / committed_dump(a), b / committed_dump(b)
    names = sorted(p.name for p in da.iterdir())
    assert names == sorted(p.name for p in db.iterdir())
    for name in names:
        assert filecmp.cmp(da / name, db / name, shallow=False), f"{name} differs"
    ma, mb = manifest(a), manifest(b)
    for field in DIFFERING_FIELDS:
        assert ma.pop(field) != mb.pop(field), f"two dumps share their {field}"
    assert ma == mb


@pytest.fixture
def tier_layout(request, monkeypatch):
    """``host_hybrid``: the GPU layout on CPU tensors (slow tier in host memory)."""
    if request.param == "host_hybrid":
        monkeypatch.setattr(placement._ops, "executor", lambda: "cuda-emulated")
    return request.param


@pytest.mark.parametrize("state", ["empty", "trained", "churned"])
@pytest.mark.parametrize("tier_layout", TIERS, indirect=True)
def test_dump_load_dump_is_byte_identical(tier_layout, state, tmp_path):
    first, second = dump_load_dump(tmp_path, tier_layout, state)
    assert_same_dump(first, second)
    rows = [f["rows"] for t in manifest(first)["tables"].values() for f in t["files"]]
    assert min(rows) > INIT_ROWS if state != "empty" else rows == [0] * len(STRATEGIES)


def read_dump(path) -> dict:
    """Table -> field -> the rows of its files (rank 0), sorted by key."""
    directory = path / committed_dump(path)
    out = {}
    for name, meta in manifest(path)["tables"].items():
        (entry,) = meta["files"]
        fields = {}
        for field, f in entry["fields"].items():
            raw = torch.from_file(str(directory / f["file"]), size=f["bytes"], dtype=torch.uint8)
            dtype = torch.int64 if field in ("keys", "scores", "timestamps") else torch.float32
            flat = raw.view(dtype)
            fields[field] = flat.view(entry["rows"], flat.numel() // max(1, entry["rows"]))
        order = torch.argsort(fields["keys"].view(-1))
        out[name] = {field: rows[order] for field, rows in fields.items()}
    return out


NO_EVICTION = [DynamicEmbScoreStrategy.NO_EVICTION]


@pytest.mark.parametrize("state", ["empty", "trained"])
def test_no_eviction_dump_load_dump_holds_the_same_rows(state, tmp_path):
    first, second = dump_load_dump(tmp_path, "memory", state, NO_EVICTION)
    a, b = read_dump(first), read_dump(second)
    assert a.keys() == b.keys()
    for name in a:
        assert a[name].keys() == b[name].keys()
        for field in a[name]:
            assert torch.equal(a[name][field], b[name][field]), f"{name}.{field}"
    ma, mb = manifest(first), manifest(second)
    for m in (ma, mb):  # the data files' CRCs differ with their order
        for field in DIFFERING_FIELDS:
            m.pop(field)
        for f in m["tables"]["t0"]["files"][0]["fields"].values():
            f.pop("crc32")
    assert ma == mb


@pytest.mark.xfail(
    strict=True,
    reason="known gap: a NO_EVICTION key whose home bucket is full sits in a later bucket; "
    "a restore batch places every key in its home bucket before it spills any (the batch "
    "rule of csrc/core/table_ops.h), so a spilled key lands after keys that training "
    "inserted after it: the same rows, in another slot order (the dump's row order)",
)
def test_no_eviction_dump_load_dump_is_byte_identical(tmp_path):
    assert_same_dump(*dump_load_dump(tmp_path, "memory", "trained", NO_EVICTION))
