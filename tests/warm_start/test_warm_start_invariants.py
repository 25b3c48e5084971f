"""Invariants of a warm start, against the source it reads: one read per batch of new
keys (only them, each once while stored), every table-side path that inserts (found
or new, evicting, growing), the optimizer state taken from the source or initialised,
and nothing read in eval mode."""

import pytest
import torch

from dynemb import (
    BatchedDynamicEmbeddingTables,
    DynamicEmbPoolingMode,
    DynamicEmbTableOptions,
    ScoredHashTable,
)
from dynemb.optimizer import EmbOptimType
from dynemb.warm_start import TableFill, WarmStart
from tests.support.counting import CountingSource
from tests.support.static_models import batch, dynamic_twin, static_model


def _distinct_new(indices, offsets, stored: set, t: int, batch_size: int) -> set:
    keys = indices[offsets[t * batch_size] : offsets[(t + 1) * batch_size]].tolist()
    return set(keys) - stored


def test_one_read_per_batch_of_new_keys_each_key_once_none_in_eval(device):
    state = static_model().state_dict()
    sources = {
        name: CountingSource(WarmStart.from_state_dict(state, name)) for name in ("t0", "t1")
    }
    dynamic = dynamic_twin(sources, device)
    g = torch.Generator().manual_seed(3)
    stored = [set(), set()]
    for _ in range(5):
        _, indices, offsets = batch(g)
        reads = [len(s.asked) for s in sources.values()]
        news = [_distinct_new(indices, offsets, stored[t], t, 6) for t in range(2)]
        dynamic(indices.to(device), offsets.to(device)).sum().backward()
        for t, source in enumerate(sources.values()):
            assert len(source.asked) == reads[t] + (1 if news[t] else 0)  # one gather
            if news[t]:
                assert source.asked[-1] == sorted(news[t])  # only the new keys
            stored[t] |= news[t]
    for t, source in enumerate(sources.values()):  # no key read twice (none evicted)
        assert source.keys_asked() == sorted(stored[t])
    dynamic.eval()
    before = [len(s.asked) for s in sources.values()]
    _, indices, offsets = batch(g, high={"t0": 10**6, "t1": 10**6})  # unknown keys
    dynamic(indices.to(device), offsets.to(device))
    assert [len(s.asked) for s in sources.values()] == before


def test_a_key_inserted_by_eviction_or_growth_reads_the_source(device):
    weight = torch.randn(1000, 4)
    for init_capacity in (16, 64):  # growth from 16 slots / a full bucket that evicts
        table = ScoredHashTable(dim=4, capacity=64, init_capacity=init_capacity,
                                bucket_capacity=16, device=device)  # fmt: skip
        table.warm_start = TableFill(WarmStart.from_tensor(weight), 4, 0, torch.float32, "t")
        evicted = 0
        for start in range(0, 200, 25):
            keys = torch.arange(start, start + 25, device=device)
            rows = table.find_or_insert(keys)
            stored = table.contains(keys)
            assert torch.equal(rows[stored].cpu(), weight[keys[stored].cpu()])
            evicted += table.last_stats.evicted
            slots, _ = table.find_or_insert_slots(keys + 500)
            kept = slots >= 0
            got = table.buffers.rows(slots[kept], 4)
            assert torch.equal(got.cpu(), weight[(keys + 500)[kept].cpu()])
        assert evicted > 0 and table.capacity() == 64


def test_optimizer_state_from_the_source_or_initialised(device):
    dim, rows = 4, 20
    weight = torch.randn(rows, dim)
    module_args = dict(
        feature_table_map=[0], pooling_mode=DynamicEmbPoolingMode.SUM,
        optimizer=EmbOptimType.EXACT_ROWWISE_ADAGRAD, learning_rate=0.1, device=device,
    )  # fmt: skip
    state = torch.rand(rows, 1) + 1.0
    options = DynamicEmbTableOptions(dim=dim, max_capacity=64, bucket_capacity=16)
    with_state = BatchedDynamicEmbeddingTables(
        [DynamicEmbTableOptions(**{**vars(options), "warm_start":
                                   WarmStart.from_tensor(weight, state=state)})],
        **module_args,
    )  # fmt: skip
    without = BatchedDynamicEmbeddingTables(
        [DynamicEmbTableOptions(**{**vars(options), "warm_start": WarmStart.from_tensor(weight)})],
        **module_args,
    )
    keys = torch.tensor([1, 7, 19, 25], device=device)
    offsets = torch.arange(5, device=device)
    for module in (with_state, without):
        module(keys, offsets)  # forward only: the rows are as inserted
    full_with = with_state.tables[0].find_entries(keys)[0].cpu()
    full_without = without.tables[0].find_entries(keys)[0].cpu()
    assert torch.equal(full_with[:3, :dim], weight[[1, 7, 19]])
    assert torch.equal(full_with[:3, dim:], state[[1, 7, 19]])
    assert torch.equal(full_without[:3, :dim], weight[[1, 7, 19]])
    assert torch.equal(full_without[:, dim:], torch.zeros(4, 1))  # initialised (0)
    assert torch.equal(full_with[3, dim:], torch.zeros(1))  # 25: not in the source


@pytest.mark.parametrize("spill", [False, True])
def test_hybrid_and_spilled_tiers_and_change_log_see_warm_rows_as_ordinary_rows(
    spill, device, tmp_path
):
    from dynemb.table.change_log import ChangeLog

    weight = torch.randn(100, 4)
    spill_directory = str(tmp_path / "spill") if spill else None
    table = ScoredHashTable(dim=4, capacity=64, bucket_capacity=16, fast_rows=16, device=device,
                            spill_directory=spill_directory)  # fmt: skip
    table.warm_start = TableFill(WarmStart.from_tensor(weight), 4, 0, torch.float32, "t")
    table.change_log = ChangeLog()
    keys = torch.arange(0, 100, 3, device=device)  # 34 keys: both tiers
    table.find_or_insert_slots(keys)
    slots = table.find_slots(keys)
    assert bool((slots >= 16).any()) and bool((slots < 16).any())
    assert torch.equal(table.find(keys)[0].cpu(), weight[keys.cpu()])
    touched, removed = table.change_log.take()  # a delta records them as any insert
    assert sorted(touched.tolist()) == keys.tolist() and removed.numel() == 0
