"""DECAYED_LFU: a key's score is its access count decayed by elapsed steps (core/decay.h).

Scores are checked bit for bit against tests/support/decay_reference.py (the core's fixed point
redone from its definition) and, in value, against the exact decayed count in floating
point; run under DYNEMB_EXECUTOR=cuda-emulated too (the CUDA kernels' code). The
dict-based table oracle covers the strategy in test_table_oracle.py.
"""

import math
import re

import pytest
import torch

import dynemb
from dynemb import DynamicEmbScoreStrategy, DynamicEmbTableOptions
from dynemb.optimizer import EmbOptimType
from tests.support import decay_reference as decay
from tests.support import reference as ref

S = DynamicEmbScoreStrategy
DECAYED = {"decayed_lfu": S.DECAYED_LFU, "timestamp_decayed_lfu": (S.TIMESTAMP, S.DECAYED_LFU)}


def _table(strategy, half_life, capacity=1024, bucket=128):
    return dynemb.ScoredHashTable(
        dim=2, capacity=capacity, bucket_capacity=bucket, score_strategy=strategy,
        score_half_life_steps=half_life,
    )  # fmt: skip


@pytest.mark.parametrize("strategy", list(DECAYED))
@pytest.mark.parametrize("half_life", [1, 7, 1000])
def test_scores_are_the_oracle_bits_and_track_the_exact_decayed_count(strategy, half_life):
    table = _table(DECAYED[strategy], half_life)
    g = torch.Generator().manual_seed(half_life)
    history: dict[int, list] = {}
    want: dict[int, int] = {}
    steps = 120
    for step in range(1, steps + 1):
        # Gaps: some steps touch nothing the next ones use, so scores decay between.
        keys = torch.unique(torch.randint(0, 40 if step % 3 else 10, (25,), generator=g))
        table.find_or_insert(keys)
        for k in keys.tolist():
            history.setdefault(k, []).append((step, 1))
            want[k] = decay.touched(want.get(k), step, 1, half_life)
    keys = torch.tensor(sorted(want))
    got = table.get_scores(keys).tolist()
    assert got == [want[k] for k in sorted(want)]
    for k, score in zip(sorted(want), got, strict=True):
        exact = math.log2(decay.exact_count(history[k], steps, half_life))
        fixed = (score / 2**decay.FRACTION_BITS - steps) / half_life  # log2 of the count
        # core/decay.h: an update moves log2 of the count by less than 2**-15 from exact.
        assert abs(fixed - exact) <= len(history[k]) * 2.0**-15, f"key {k}"


def test_accesses_of_one_batch_count_as_one_access_of_their_number():
    """A lookup de-duplicates its indices; a key repeated c times scores s + H log2 c."""
    options = DynamicEmbTableOptions(
        dim=2, max_capacity=256, bucket_capacity=16, score_strategy=S.DECAYED_LFU,
        score_half_life_steps=5,
    )  # fmt: skip
    module = dynemb.BatchedDynamicEmbeddingTables(
        [options], [0], optimizer=EmbOptimType.EXACT_SGD, table_names=["t"]
    )
    counts = {11: 1, 12: 2, 13: 3, 14: 7}
    indices = torch.tensor([k for k, c in counts.items() for _ in range(c)])
    module(indices, torch.arange(indices.numel() + 1)).sum().backward()
    got = module.tables[0].get_scores(torch.tensor(list(counts))).tolist()
    step = module.tables[0].score_step
    assert got == [decay.access_score(step, c, 5) for c in counts.values()]
    assert decay.count_of(got[3], step, 5) == pytest.approx(7, rel=2**-14)


def _hot_then_warm(strategy, half_life=None):
    """One bucket of 16 slots: key A hot early (steps 1-40), 14 fillers at every step,
    key W warm lately (steps 91-100); at step 101 a new key N needs a slot."""
    table = _table(strategy, half_life, capacity=16, bucket=16)
    fillers = list(range(100, 114))
    for step in range(1, 101):
        keys = fillers + ([1] if step <= 40 else []) + ([2] if step > 90 else [])
        table.find_or_insert(torch.tensor(keys))
    evicted, _, _ = table.insert_and_evict(torch.tensor([3]), torch.zeros(1, 2))
    return table, evicted.tolist()


@pytest.mark.parametrize("strategy", [S.DECAYED_LFU, (S.TIMESTAMP, S.DECAYED_LFU)])
def test_a_formerly_hot_key_is_evicted_before_a_warm_one_where_lfu_keeps_it(strategy):
    lfu, lfu_evicted = _hot_then_warm(S.LFU)
    assert lfu_evicted == [2]  # LFU: W's 10 accesses count less than A's 40
    assert lfu.get_scores(torch.tensor([1])).tolist() == [40]
    table, evicted = _hot_then_warm(strategy, half_life=5)
    assert evicted == [1]  # decayed: A weighs 2**-12 accesses now, W about 6
    assert table.contains(torch.tensor([2, 3])).tolist() == [True, True]
    oracle = ref.ReferenceTable(2, 16, 16, 16, ref.DECAYED_LFU, half_life=5)
    for step in range(1, 101):
        keys = list(range(100, 114)) + ([1] if step <= 40 else []) + ([2] if step > 90 else [])
        oracle.upsert(keys)
    _, out = oracle.upsert([3], values=torch.zeros(1, 2).numpy())
    assert [v[0] for v in out.values()] == [1]
    keys = torch.tensor(sorted(oracle.entries))
    assert table.get_scores(keys).tolist() == [oracle.entries[k][1] for k in keys.tolist()]


def test_the_compound_keeps_the_last_access_time_beside_the_same_scores():
    plain = _table(S.DECAYED_LFU, 4)
    compound = _table((S.DECAYED_LFU, S.TIMESTAMP), 4)
    clock = iter(range(1000, 10**6, 10))
    compound.state.clock = lambda: next(clock)
    last = {}
    for step in range(1, 30):
        keys = torch.arange(step % 5, 20, 3)
        plain.find_or_insert(keys)
        compound.find_or_insert(keys)
        last.update(dict.fromkeys(keys.tolist(), 1000 + 10 * (step - 1)))
    keys = torch.tensor(sorted(last))
    assert torch.equal(compound.get_scores(keys), plain.get_scores(keys))
    assert compound.get_timestamps(keys).tolist() == [last[k] for k in sorted(last)]


@pytest.mark.parametrize(
    "strategy, half_life, error",
    [
        (S.DECAYED_LFU, None, ValueError),
        (S.DECAYED_LFU, 0, ValueError),
        (S.DECAYED_LFU, -3, ValueError),
        (S.DECAYED_LFU, 2**31, ValueError),
        (S.DECAYED_LFU, 2.5, TypeError),
        (S.DECAYED_LFU, True, TypeError),
        ((S.TIMESTAMP, S.DECAYED_LFU), None, ValueError),
        (S.LFU, 10, ValueError),
        ((S.TIMESTAMP, S.LFU), 10, ValueError),
    ],
)
def test_the_half_life_is_checked_and_named(strategy, half_life, error):
    with pytest.raises(error, match=rf"score_half_life_steps.*{re.escape(repr(half_life))}"):
        DynamicEmbTableOptions(dim=4, score_strategy=strategy, score_half_life_steps=half_life)
    with pytest.raises(error, match="score_half_life_steps"):
        dynemb.ScoredHashTable(
            dim=4, capacity=64, bucket_capacity=16, score_strategy=strategy,
            score_half_life_steps=half_life,
        )  # fmt: skip


def test_the_op_refuses_a_decayed_policy_without_a_half_life():
    table = _table(S.DECAYED_LFU, 3)
    keys = torch.tensor([1, 2])
    bad = dynemb._ops.Policy(ref.DECAYED_LFU, 1, 0, dynemb._ops.EVICT_ANY, 2, half_life=0)
    with pytest.raises(ValueError, match="half_life must be in"):
        dynemb._ops.table_find_or_insert(
            table.buffers.tensors(), bad, table.state.init, keys, None, torch.zeros(2, 2), []
        )
    assert table.size() == 0


def test_decayed_count_reads_scores_back_as_counts():
    table = _table(S.DECAYED_LFU, 10)
    for _ in range(3):  # key 7 at steps 1, 2, 3
        table.find_or_insert(torch.tensor([7]))
    scores = table.get_scores(torch.tensor([7]))
    for at in (3, 13, 40):
        exact = decay.exact_count([(1, 1), (2, 1), (3, 1)], at, 10)
        got = dynemb.decayed_count(scores, at, 10)
        assert got.dtype == torch.float64 and float(got[0]) == pytest.approx(exact, rel=2**-14)
        assert float(got[0]) == decay.count_of(int(scores[0]), at, 10)
    with pytest.raises(TypeError, match="`scores` must be an int64 tensor"):
        dynemb.decayed_count(scores.double(), 3, 10)
    with pytest.raises(ValueError, match="`step` must be an int >= 0, got -1"):
        dynemb.decayed_count(scores, -1, 10)
    with pytest.raises(ValueError, match="half_life_steps must be an int in"):
        dynemb.decayed_count(scores, 3, 0)
