"""Admission in caching mode (DynamicEmb runs its admission tests with caching=True):
the counter decides before a key takes a cache slot or a slow-tier row, so a cached
table with admission gives the same outputs, rows, scores and counts as the same table
without a cache (the oracle), even with a cache too small for one batch (staged keys);
a key not admitted reads the strategy's initializer and is stored in neither tier; the
counts survive a dump and load."""

import pytest
import torch

from dynemb import (
    DynamicEmbInitializerArgs,
    DynamicEmbInitializerMode,
    DynamicEmbPoolingMode,
    DynamicEmbScoreStrategy,
    DynamicEmbTableOptions,
    FrequencyAdmissionStrategy,
    KVCounter,
)
from dynemb.batched_dynamicemb_tables import BatchedDynamicEmbeddingTablesV2
from dynemb.optimizer import EmbOptimType

KEYS = 300
MINUS_ONE = DynamicEmbInitializerArgs(mode=DynamicEmbInitializerMode.CONSTANT, value=-1.0)


def make(caching: bool, pooling, score=DynamicEmbScoreStrategy.LFU, cache_rows=32, features=2):
    options = DynamicEmbTableOptions(
        dim=4, max_capacity=4096, caching=caching,
        local_hbm_for_values=cache_rows * 12 * 4 if caching else 0,  # Adam: 12 columns
        initializer_args=DynamicEmbInitializerArgs(mode=DynamicEmbInitializerMode.NORMAL),
        admit_strategy=FrequencyAdmissionStrategy(3, MINUS_ONE, counter=KVCounter(4096)),
        score_strategy=score,
    )  # fmt: skip
    return BatchedDynamicEmbeddingTablesV2(
        [options], table_names=["t"], feature_table_map=[0] * features, pooling_mode=pooling,
        optimizer=EmbOptimType.ADAM,
    )  # fmt: skip


def counts(m) -> dict:
    keys, c = m.admission_counters[0].dump()
    return dict(zip(keys.tolist(), c.tolist()))


def batches(steps: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        yield torch.randint(0, KEYS, (120,), generator=g)


@pytest.mark.parametrize("pooling", [DynamicEmbPoolingMode.NONE, DynamicEmbPoolingMode.SUM])
@pytest.mark.parametrize("cache_rows", [16, 256])  # 16: most keys of a batch are staged
def test_cached_table_with_admission_matches_the_uncached_table(pooling, cache_rows):
    plain, cached = make(False, pooling), make(True, pooling, cache_rows=cache_rows)
    for keys in batches(12):
        offsets = torch.arange(keys.numel() + 1)
        if pooling != DynamicEmbPoolingMode.NONE:
            offsets = torch.arange(0, keys.numel() + 1, 2)
        want, got = plain(keys, offsets), cached(keys, offsets)
        assert torch.equal(want, got)
        (want * want).sum().backward()
        (got * got).sum().backward()
    assert counts(plain) == counts(cached) and counts(cached)  # some keys still counted
    probe = torch.arange(KEYS)
    stored = plain.tables[0].contains(probe)
    assert torch.equal(stored, cached.tables[0].contains(probe))
    assert 0 < int(stored.sum()) < KEYS
    want_rows, _ = plain.tables[0].find(probe)
    got_rows, _ = cached.tables[0].find(probe)
    assert torch.equal(want_rows, got_rows)
    admitted = probe[stored]
    assert torch.equal(
        plain.tables[0].get_scores(admitted),
        cached.tables[0].persistent_table().get_scores(admitted),
    )


def test_a_key_not_admitted_reads_the_initializer_and_is_stored_nowhere():
    m = make(True, DynamicEmbPoolingMode.NONE, features=1)
    out = m(torch.tensor([5, 6, 6]), torch.arange(4))
    assert out[:, 0].tolist() == [-1.0, -1.0, -1.0]
    out.sum().backward()
    assert m.tables[0].contains(torch.tensor([5, 6])).tolist() == [False, False]
    assert m.tables[0].cache_size() == 0 and m.tables[0].size() == 0
    assert counts(m) == {5: 1, 6: 2}
    m(torch.tensor([6]), torch.arange(2)).sum().backward()  # third sight: admitted
    assert m.tables[0].contains(torch.tensor([5, 6])).tolist() == [False, True]
    assert counts(m) == {5: 1}  # an admitted key leaves the counter


def test_prefetch_brings_only_stored_keys_into_the_cache():
    m = make(True, DynamicEmbPoolingMode.NONE, features=1)
    for _ in range(3):
        m(torch.tensor([1]), torch.arange(2)).sum().backward()  # key 1 admitted
    keys = torch.tensor([1, 2])
    m.prefetch(keys, torch.arange(3))
    assert m.tables[0].cache_size() == 1  # key 2 is not admitted: no cache slot
    out = m(keys, torch.arange(3))
    assert out[1, 0].item() == -1.0 and counts(m) == {2: 1}
    out.sum().backward()


def test_counts_survive_dump_and_load(tmp_path):
    m = make(True, DynamicEmbPoolingMode.NONE)
    for keys in batches(4):
        m(keys, torch.arange(keys.numel() + 1)).sum().backward()
    m.dump(str(tmp_path), optim=True, counter=True)
    restored = make(True, DynamicEmbPoolingMode.NONE)
    restored.load(str(tmp_path), optim=True, counter=True)
    assert counts(restored) == counts(m) and counts(m)
    probe = torch.arange(KEYS)
    assert torch.equal(m.tables[0].contains(probe), restored.tables[0].contains(probe))
    keys = torch.arange(KEYS)
    m.eval()
    restored.eval()
    assert torch.equal(m(keys, torch.arange(KEYS + 1)), restored(keys, torch.arange(KEYS + 1)))
