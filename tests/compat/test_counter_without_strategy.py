"""A table given an admission counter but no strategy (DynamicEmb's LFU-score tests build
tables so): it is accepted, admits every key on first sight, and so trains exactly as a
table without admission (the oracle); the counter, every key admitted at once, stays
empty, and a dump with ``counter=True`` writes its (empty) files."""

import pytest
import torch

from dynemb import DynamicEmbScoreStrategy, DynamicEmbTableOptions, KVCounter
from dynemb.batched_dynamicemb_tables import BatchedDynamicEmbeddingTablesV2


def make(counter: bool, caching: bool):
    kw = {"admission_counter": KVCounter(1024)} if counter else {}
    with pytest.warns(DeprecationWarning) if counter else _nothing():
        options = DynamicEmbTableOptions(
            dim=4, max_capacity=1024, score_strategy=DynamicEmbScoreStrategy.LFU,
            caching=caching, local_hbm_for_values=64 * 4 * 4 if caching else 0, **kw,
        )  # fmt: skip
    return BatchedDynamicEmbeddingTablesV2([options], table_names=["t"])


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


@pytest.mark.parametrize("caching", [False, True])
def test_every_key_is_admitted_as_without_a_counter(caching, tmp_path):
    plain, counted = make(False, caching), make(True, caching)
    g = torch.Generator().manual_seed(3)
    for _ in range(5):
        keys = torch.randint(0, 200, (64,), generator=g)
        want, got = plain(keys, torch.arange(65)), counted(keys, torch.arange(65))
        assert torch.equal(want, got)
        want.sum().backward()
        got.sum().backward()
    probe = torch.arange(200)
    stored = plain.tables[0].contains(probe)
    assert torch.equal(stored, counted.tables[0].contains(probe))
    want_scores = plain.tables[0].persistent_table().get_scores(probe[stored])
    got_scores = counted.tables[0].persistent_table().get_scores(probe[stored])
    assert torch.equal(want_scores, got_scores)  # LFU counts every access
    assert counted.admission_counters[0].size() == 0
    counted.dump(str(tmp_path), counter=True, format="dynamicemb")
    files = sorted(p.name for p in tmp_path.rglob("*counter*"))
    assert files == [
        "t_counter_frequencies.rank_0.world_size_1",
        "t_counter_keys.rank_0.world_size_1",
    ]
    assert all(p.stat().st_size == 0 for p in tmp_path.rglob("*counter*"))
