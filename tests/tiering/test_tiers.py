"""Hybrid tiers and the spill tier: the same training as one in-memory table, files
that reopen as the same table, checkpoints in every mode, bad arguments refused."""

import gc
import os

import pytest
import torch

from dynemb import (
    BatchedDynamicEmbeddingTables,
    DynamicEmbDump,
    DynamicEmbLoad,
    DynamicEmbPoolingMode,
    DynamicEmbScoreStrategy,
    DynamicEmbTableOptions,
    ScoredHashTable,
)
from dynemb.optimizer import EmbOptimType

DIM, B, FEATURES = 8, 32, 2
ROW_BYTES = {  # (dim + optimizer state) float32 bytes per row
    EmbOptimType.EXACT_SGD: DIM * 4,
    EmbOptimType.EXACT_ROWWISE_ADAGRAD: (DIM + 1) * 4,
    EmbOptimType.ADAM: 3 * DIM * 4,
}


def make(optimizer, tmp_path=None, fast_rows=None, name="t", **kw):
    opts = DynamicEmbTableOptions(
        dim=DIM, max_capacity=2048, init_capacity=256, bucket_capacity=16, seed=4,
        score_strategy=DynamicEmbScoreStrategy.LFU,
        local_hbm_for_values=0 if fast_rows is None else fast_rows * ROW_BYTES[optimizer],
        spill_directory=None if tmp_path is None else str(tmp_path), **kw,
    )  # fmt: skip
    return BatchedDynamicEmbeddingTables(
        [opts], feature_table_map=[0] * FEATURES, pooling_mode=DynamicEmbPoolingMode.SUM,
        optimizer=optimizer, learning_rate=0.05, table_names=[name],
    )  # fmt: skip


def batches(steps, seed=0):
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        lengths = torch.randint(0, 5, (FEATURES * B,), generator=g)
        offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
        ids = torch.randint(0, 900, (int(lengths.sum()),), generator=g)
        yield ids * 0x9E3779B97F4A7C15 % (2**61), offsets  # spread over the key space


def train(module, steps, seed=0):
    outs = []
    for indices, offsets in batches(steps, seed):
        out = module(indices, offsets)
        (out * torch.linspace(-1, 1, out.shape[1])).sum().backward()
        outs.append(out.detach())
    return outs


def contents(module):
    t = module.tables[0]
    k, v, s, _ = t.export_batch(0, t.capacity(), include_extra=True)
    order = torch.argsort(k)
    return k[order], v[order], s[order]


def assert_same_contents(a, b):
    for x, y in zip(contents(a), contents(b)):
        assert torch.equal(x, y)


@pytest.mark.parametrize("optimizer", list(ROW_BYTES))
@pytest.mark.parametrize("tier", ["hybrid", "spill", "spill_hybrid"])
def test_training_in_tiers_equals_training_in_memory(optimizer, tier, tmp_path):
    memory = make(optimizer)
    spill = tmp_path if tier.startswith("spill") else None
    fast = None if tier == "spill" else 300  # fast rows: fewer than the table grows to
    tiered = make(optimizer, spill, fast_rows=fast)
    for a, b in zip(train(memory, 12), train(tiered, 12)):
        assert torch.equal(a, b)
    assert_same_contents(memory, tiered)
    storage = tiered.tables[0].buffers
    assert storage.num_slots > 300 and storage.slow_values.shape[0] == storage.num_slots - (
        fast or 0
    )
    if spill is not None:
        assert os.path.isfile(os.path.join(spill, "t.rank0", "table.json"))


@pytest.mark.parametrize("fast_rows", [None, 100])
def test_a_flushed_spill_directory_reopens_as_the_same_table(fast_rows, tmp_path):
    first = make(EmbOptimType.ADAM, tmp_path, fast_rows=fast_rows)
    train(first, 8)
    first.flush()
    assert first.tables[0].buffers.generation > 0  # it grew: files of a later generation
    generations = [e for e in os.listdir(tmp_path / "t.rank0") if e.startswith("g")]
    assert generations == [f"g{first.tables[0].buffers.generation}"]
    with pytest.raises(ValueError, match="is in use by another live table"):
        make(EmbOptimType.ADAM, tmp_path, fast_rows=fast_rows)
    memory = make(EmbOptimType.ADAM)  # the same training, in memory
    train(memory, 8)
    assert_same_contents(first, memory)
    size, step = first.tables[0].size(), first.step
    del first
    gc.collect()
    reopened = make(EmbOptimType.ADAM, tmp_path, fast_rows=fast_rows)
    assert reopened.tables[0].size() == size
    assert_same_contents(memory, reopened)
    # both go on identically (Adam's step lives in the module, not the table)
    reopened.step = step
    for a, b in zip(train(memory, 3, seed=1), train(reopened, 3, seed=1)):
        assert torch.equal(a, b)
    assert_same_contents(memory, reopened)


def test_spill_reopen_refuses_another_layout_and_damaged_files(tmp_path):
    path = str(tmp_path / "table")
    t = ScoredHashTable(dim=4, capacity=1024, bucket_capacity=16, spill_directory=path)
    t.find_or_insert(torch.arange(100))
    t.flush()
    del t
    gc.collect()
    with pytest.raises(ValueError, match="dim=4, these arguments give dim=5"):
        ScoredHashTable(dim=5, capacity=1024, bucket_capacity=16, spill_directory=path)
    with pytest.raises(
        ValueError, match="bucket_capacity=16, these arguments give bucket_capacity=32"
    ):
        ScoredHashTable(dim=4, capacity=1024, bucket_capacity=32, spill_directory=path)
    keys_file = os.path.join(path, "g0", "keys")
    os.truncate(keys_file, os.path.getsize(keys_file) - 8)
    with pytest.raises(ValueError, match="keys: 8184 bytes, expected 8192"):
        ScoredHashTable(dim=4, capacity=1024, bucket_capacity=16, spill_directory=path)


def test_tier_arguments_are_checked():
    with pytest.raises(ValueError, match="fast_rows"):
        ScoredHashTable(dim=4, capacity=1024, fast_rows=-1)
    with pytest.raises(TypeError, match="spill_directory must be a path"):
        ScoredHashTable(dim=4, capacity=1024, spill_directory=3)
    for field, value, error in [
        (
            "local_hbm_for_values",
            -1,
            "local_hbm_for_values must be an int >= 0 \\(bytes\\), got -1",
        ),
        ("spill_directory", 7, "spill_directory must be a path or None, got 7"),
    ]:
        opts = DynamicEmbTableOptions(dim=4, max_capacity=64, **{field: value})
        with pytest.raises((TypeError, ValueError), match=error):
            BatchedDynamicEmbeddingTables([opts], feature_table_map=[0])


@pytest.mark.parametrize("tier", ["hybrid", "spill_hybrid"])
def test_checkpoints_move_between_tiers(tier, tmp_path):
    spill = tmp_path / "spill" if tier == "spill_hybrid" else None
    tiered = make(EmbOptimType.EXACT_ROWWISE_ADAGRAD, spill, fast_rows=200)
    train(tiered, 8)
    DynamicEmbDump(str(tmp_path / "ckpt"), tiered, optim=True)
    memory = make(EmbOptimType.EXACT_ROWWISE_ADAGRAD)  # loaded into one in-memory tier
    DynamicEmbLoad(str(tmp_path / "ckpt"), memory, optim=True)
    assert_same_contents(tiered, memory)
    other = make(EmbOptimType.EXACT_ROWWISE_ADAGRAD, tmp_path / "other", fast_rows=50)
    DynamicEmbLoad(str(tmp_path / "ckpt"), other, optim=True)  # and into other tiers
    assert_same_contents(tiered, other)
