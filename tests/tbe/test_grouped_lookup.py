"""The grouped training lookup (table_find_or_insert_slots_grouped; dynemb.table.growth
find_or_insert_slots_grouped): every table of a batch in one op call gives the bits of
one per-table call each (the oracle), on both op libraries, evictions, refusals and
LFU counts included; bad arguments are refused, naming the table, before any table
changes; and a module whose tables grow, evict or fill up trains exactly as with one
lookup call per table (both on each test device).
"""

import dynemb._C  # noqa: F401  (loads both op libraries)
import pytest
import torch

from dynemb import (
    DynamicEmbCheckMode,
    DynamicEmbPoolingMode,
    DynamicEmbScoreStrategy,
    DynamicEmbTableOptions,
    EmbOptimType,
    _ops,
)
from dynemb.table.scored_hash_table import ScoredHashTable
from dynemb.tbe.batched_dynamic_embedding_tables import BatchedDynamicEmbeddingTables

LIBRARIES = {"cpu": torch.ops.dynemb, "cuda-emulated": torch.ops.dynemb_cuda_emulated}
# (strategy, dim, keys per batch, evicts): 32 slots a table. The last two never evict
# and are offered more keys than they hold: LFU below capacity refuses keys in the
# batch rule's first pass, NO_EVICTION spills them to other buckets in its second.
TABLES = [
    (DynamicEmbScoreStrategy.TIMESTAMP, 4, 40, True),
    (DynamicEmbScoreStrategy.LFU, 8, 24, True),
    (DynamicEmbScoreStrategy.STEP, 3, 0, True),  # no keys this batch
    (DynamicEmbScoreStrategy.LFU, 16, 60, False),
    (DynamicEmbScoreStrategy.NO_EVICTION, 4, 50, False),
]


def _tables():
    return [
        ScoredHashTable(dim=d, capacity=32, bucket_capacity=16, score_strategy=s, seed=7 + t,
                        extra_columns=1)
        for t, (s, d, _, _) in enumerate(TABLES)
    ]  # fmt: skip


def _arguments(tables, seed):
    """Per table: buffers (copies), policy, init, distinct keys, accesses."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for table, (_, dim, n, evicts) in zip(tables, TABLES):
        keys = torch.randperm(200, generator=g)[:n] * 7919 - 10**6
        accesses = torch.randint(1, 5, (n,), generator=g)
        policy = _ops.Policy(table.strategy_code, 3 + seed, table.seed, -1 if evicts else 0, dim)
        buffers = [x.clone() for x in table.buffers.tensors()]
        out.append((buffers, policy, table.init_values, keys, accesses))
    return out


def _assert_equal(a, b, what):
    assert a.dtype == b.dtype and torch.equal(a, b), what


@pytest.mark.parametrize("library", list(LIBRARIES))
def test_grouped_lookup_is_the_per_table_lookup(library):
    lib = LIBRARIES[library]
    tables = _tables()
    for seed in range(3):  # batches in turn, so later ones hit and evict earlier keys
        grouped = _arguments(tables, seed)
        alone = [([x.clone() for x in buffers], *rest) for buffers, *rest in grouped]
        bufs, policies, inits, keys, accesses = zip(*grouped)
        slots, status, counts = lib.table_find_or_insert_slots_grouped(
            [x for b in bufs for x in b], [v for p in policies for v in p],
            [v for i in inits for v in i], list(keys), list(accesses),
        )  # fmt: skip
        assert counts.shape == (len(TABLES), 4)
        for t, (buffers, policy, init, k, a) in enumerate(alone):
            want = lib.table_find_or_insert_slots(buffers, list(policy), init, k, None, a)
            for got, expected, what in zip((slots[t], status[t], counts[t]), want,
                                           ("slots", "status", "counts")):  # fmt: skip
                _assert_equal(got, expected, f"batch {seed}, table {t}: {what}")
            for x, y in zip(bufs[t], buffers):
                _assert_equal(x, y, f"batch {seed}, table {t}: buffers")
        assert counts[3, _ops.Status.FAILED] > 0 or seed == 0  # the full table refuses keys
        assert counts[4, _ops.Status.FAILED] > 0 or seed == 0
        assert int(counts[1].sum()) == TABLES[1][2]
        for table, buffers in zip(tables, bufs):  # the next batch starts from this state
            for x, y in zip(table.buffers.tensors(), buffers):
                x.copy_(y)


@pytest.mark.parametrize("library", list(LIBRARIES))
def test_grouped_lookup_refuses_bad_arguments_before_any_change(library):
    lib = LIBRARIES[library]
    tables = _tables()
    grouped = _arguments(tables, 0)
    before = [[x.clone() for x in b] for b, *_ in grouped]

    def call(keys=None, accesses=None, tables_of=None):
        bufs, policies, inits, k, a = zip(*grouped)
        bufs = tables_of or bufs
        return lib.table_find_or_insert_slots_grouped(
            [x for b in bufs for x in b], [v for p in policies for v in p],
            [v for i in inits for v in i], keys or list(k), a if accesses is None else accesses,
        )  # fmt: skip

    bad_keys = [k for *_, k, _ in grouped]
    bad_keys[3] = bad_keys[3].to(torch.int32)
    with pytest.raises(TypeError, match=r"table_find_or_insert_slots_grouped, table 3: `keys`"):
        call(keys=bad_keys)
    short = [a for *_, a in grouped]
    short[1] = short[1][:-1]
    with pytest.raises(ValueError, match=r"table 1: `accesses` has 23 elements, `keys` has 24"):
        call(accesses=short)
    with pytest.raises(ValueError, match=r"`accesses` must hold no tensor or one per table"):
        call(accesses=short[:2])
    same = [b for b, *_ in grouped]
    same[3] = same[0]
    with pytest.raises(ValueError, match="tables 0 and 3 are the same table"):
        call(tables_of=same)
    for (buffers, *_), kept in zip(grouped, before):
        for x, y in zip(buffers, kept):
            assert torch.equal(x, y), "a refused call changed a table"
    with pytest.raises(ValueError, match="needs at least one table"):
        _ops.table_find_or_insert_slots_grouped([], [], [], [])


def _module(grouped: bool, safe_check_mode=DynamicEmbCheckMode.IGNORE, device="cpu"):
    """Three tables: one grows (init 32 slots of 256), one evicts (64), one never evicts
    and fills up (64 slots); dims 4, 8, 4. No TIMESTAMP: its scores are the clock's."""
    options = [
        DynamicEmbTableOptions(dim=4, max_capacity=256, init_capacity=32, bucket_capacity=16,
                               score_strategy=DynamicEmbScoreStrategy.STEP),
        DynamicEmbTableOptions(dim=8, max_capacity=64, bucket_capacity=16,
                               score_strategy=DynamicEmbScoreStrategy.LFU),
        DynamicEmbTableOptions(dim=4, max_capacity=64, bucket_capacity=16,
                               score_strategy=DynamicEmbScoreStrategy.NO_EVICTION,
                               safe_check_mode=safe_check_mode),
    ]  # fmt: skip
    module = BatchedDynamicEmbeddingTables(
        options, feature_table_map=[0, 1, 2, 0], pooling_mode=DynamicEmbPoolingMode.SUM,
        optimizer=EmbOptimType.EXACT_ROWWISE_ADAGRAD, learning_rate=0.1, device=device,
    )  # fmt: skip
    if not grouped:  # the oracle: one lookup call per table
        module._lookups._groups_lookup = lambda t: False
    return module


def _batch(step, b=16):
    g = torch.Generator().manual_seed(step)
    lengths = torch.randint(0, 6, (4 * b,), generator=g)
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
    indices = torch.randint(0, 150, (int(offsets[-1]),), generator=g) * 104729 + step
    return indices, offsets


def test_a_module_trains_as_with_a_lookup_per_table(device):
    modules = [_module(True, device=device), _module(False, device=device)]
    for step in range(8):
        indices, offsets = _batch(step)
        outs = []
        for m in modules:
            out = m(indices.to(m.device), offsets.to(m.device))
            (out * torch.linspace(-1, 1, out.shape[1], device=m.device)).sum().backward()
            outs.append(out.detach().cpu())
        assert torch.equal(outs[0], outs[1]), f"step {step}: outputs differ"
    grouped, alone = modules
    assert grouped.tables[0].capacity() > 32, "table 0 did not grow"
    assert grouped.safe_check_failures[2] > 0, "table 2 never refused a key"
    assert grouped.safe_check_failures == alone.safe_check_failures
    for t, (a, b) in enumerate(zip(grouped.tables, alone.tables)):
        assert a.size() == b.size() and a.capacity() == b.capacity(), f"table {t}"
        for x, y in zip(a.buffers.tensors(), b.buffers.tensors()):
            assert torch.equal(x, y), f"table {t}: buffers differ"


def test_a_full_table_warns_from_the_grouped_lookup():
    module = _module(True, safe_check_mode=DynamicEmbCheckMode.WARNING)
    with pytest.warns(UserWarning, match="'table_2': .* keys could not be stored"):
        for step in range(8):
            indices, offsets = _batch(step)
            module(indices, offsets).sum().backward()


@pytest.mark.parametrize("library", list(LIBRARIES))
def test_tables_of_several_value_dtypes_are_looked_up_one_by_one(library):
    lib = LIBRARIES[library]
    tables = [
        ScoredHashTable(dim=4, capacity=32, bucket_capacity=16, value_dtype=dtype, seed=t)
        for t, dtype in enumerate((torch.float32, torch.bfloat16, torch.float32))
    ]
    keys = [torch.arange(20) * 31 + t for t in range(3)]
    policies = [_ops.Policy(t.strategy_code, 5, t.seed, -1, 4) for t in tables]
    bufs = [[x.clone() for x in t.buffers.tensors()] for t in tables]
    slots, status, counts = lib.table_find_or_insert_slots_grouped(
        [x for b in bufs for x in b], [v for p in policies for v in p],
        [v for t in tables for v in t.init_values], keys, [],
    )  # fmt: skip
    for t, table in enumerate(tables):
        alone = [x.clone() for x in table.buffers.tensors()]
        want = lib.table_find_or_insert_slots(alone, list(policies[t]), table.init_values,
                                              keys[t], None, None)  # fmt: skip
        for got, expected in zip((slots[t], status[t], counts[t]), want):
            _assert_equal(got, expected, f"table {t}")
        for x, y in zip(bufs[t], alone):
            _assert_equal(x, y, f"table {t}: buffers")
    assert int(counts[:, _ops.Status.INSERTED].sum()) == 60


# (strategy, half-life steps): every strategy that evicts and takes no caller scores.
DISTINCT_STRATEGIES = [
    (DynamicEmbScoreStrategy.TIMESTAMP, 0),
    (DynamicEmbScoreStrategy.STEP, 0),
    (DynamicEmbScoreStrategy.LFU, 0),
    (DynamicEmbScoreStrategy.DECAYED_LFU, 8),
    ((DynamicEmbScoreStrategy.TIMESTAMP, DynamicEmbScoreStrategy.LFU), 0),
]


def _same_bits_with_distinct_keys(lib, tables, ours, full, policies, keys, accesses, what):
    """Runs one grouped lookup on ``ours`` (buffers per table) with ``distinct_keys=True``
    and on ``full`` without, and asserts the same slots, statuses, counts and buffers.
    Returns the counts (T, 4)."""
    results = []
    for bufs, distinct in ((ours, True), (full, False)):
        results.append(lib.table_find_or_insert_slots_grouped(
            [x for b in bufs for x in b], [v for p in policies for v in p],
            [v for t in tables for v in t.init_values], keys, accesses, distinct,
        ))  # fmt: skip
    (slots, status, counts), (want_slots, want_status, want_counts) = results
    for t in range(len(tables)):
        _assert_equal(slots[t], want_slots[t], f"{what}, table {t}: slots")
        _assert_equal(status[t], want_status[t], f"{what}, table {t}: status")
        for x, y in zip(ours[t], full[t]):
            _assert_equal(x, y, f"{what}, table {t}: buffers")
    _assert_equal(counts, want_counts, f"{what}: counts")
    return counts


@pytest.mark.parametrize("library", list(LIBRARIES))
@pytest.mark.parametrize("threads", [1, 2])
def test_distinct_keys_decide_as_the_full_probe(library, threads):
    """``distinct_keys=True`` (new keys of an evicting table go straight to the victim
    search) gives the bits of the full probe: slots, statuses, counts and every buffer,
    with pinned residents (the previous batch still in flight), a score floor that
    refuses victims, hits and evictions in one batch, on one and two threads."""
    lib = LIBRARIES[library]
    torch_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        tables = [
            ScoredHashTable(dim=4, capacity=2048, bucket_capacity=128, score_strategy=s,
                            seed=3 + t, extra_columns=1, score_half_life_steps=h or None)
            for t, (s, h) in enumerate(DISTINCT_STRATEGIES)
        ]  # fmt: skip
        ours = [[x.clone() for x in t.buffers.tensors()] for t in tables]
        full = [[x.clone() for x in t.buffers.tensors()] for t in tables]
        g = torch.Generator().manual_seed(11)
        evicted = refused = 0
        for batch in range(1, 7):
            keys = [torch.randperm(12000, generator=g)[:3000] * 7919 - 10**7 for _ in tables]
            accesses = [torch.randint(1, 4, (3000,), generator=g) for _ in tables]
            # The last batch evicts only residents scored below its floor: some refused.
            floor = _ops.EVICT_ANY if batch < 6 else 3
            policies = [
                _ops.Policy(t.strategy_code, 100 + batch, t.seed, floor, 4, batch, batch - 1,
                            t.score_half_life_steps or 0, batch)
                for t in tables
            ]  # fmt: skip
            counts = _same_bits_with_distinct_keys(
                lib, tables, ours, full, policies, keys, accesses, f"batch {batch}"
            )
            evicted += int(counts[:, _ops.Status.EVICTED].sum())
            refused += int(counts[:, _ops.Status.FAILED].sum())
        assert evicted > 0 and refused > 0, (evicted, refused)
    finally:
        torch.set_num_threads(torch_threads)


@pytest.mark.parametrize("library", list(LIBRARIES))
@pytest.mark.parametrize("threads", [1, 2])
def test_distinct_keys_without_eviction_decide_as_the_full_probe(library, threads):
    """NO_EVICTION under ``distinct_keys=True`` (a new key pass 0 found in neither of its
    buckets takes a free slot of its chosen bucket without a second find) gives the bits
    of the full probe: slots, statuses, counts and every buffer, overflow flags
    included, from an empty table until it refuses keys, through hits, placements in
    second buckets and pass 2's spills, on one and two threads."""
    lib = LIBRARIES[library]
    torch_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        tables = [
            ScoredHashTable(dim=4, capacity=c, bucket_capacity=b, seed=5 + t, extra_columns=1,
                            score_strategy=DynamicEmbScoreStrategy.NO_EVICTION)
            for t, (c, b) in enumerate([(2048, 128), (1024, 32)])
        ]  # fmt: skip
        ours = [[x.clone() for x in t.buffers.tensors()] for t in tables]
        full = [[x.clone() for x in t.buffers.tensors()] for t in tables]
        flags = _ops.TABLE_TENSORS.index("overflow")
        g = torch.Generator().manual_seed(13)
        totals = torch.zeros(4, dtype=torch.int64)
        for batch in range(1, 9):
            keys = [torch.randperm(4000, generator=g)[:700] * 7919 - 10**7 for _ in tables]
            policies = [_ops.Policy(t.strategy_code, batch, t.seed, 0, 4) for t in tables]
            counts = _same_bits_with_distinct_keys(
                lib, tables, ours, full, policies, keys, [], f"batch {batch}"
            )
            totals += counts.sum(0)
        assert int(totals[_ops.Status.HIT]) > 0 and int(totals[_ops.Status.FAILED]) > 0, totals
        # Every slot taken before the first refusal: two choices and pass 2 fill them.
        assert int(totals[_ops.Status.INSERTED]) == sum(b[0].numel() for b in ours), totals
        for bufs in ours:  # keys went to second buckets: homes were flagged
            assert int(bufs[flags].count_nonzero()) > 0
    finally:
        torch.set_num_threads(torch_threads)
