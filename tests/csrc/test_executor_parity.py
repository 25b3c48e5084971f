"""The CPU executor, the emulated CUDA executor and, with a GPU, the CUDA executor give
the same bits.

Every op runs on copies of the same table: through ``torch.ops.dynemb`` (the CPU
executor, at 1 and 2 threads), through ``torch.ops.dynemb_cuda_emulated`` (csrc/cuda
built for the host, its kernels racing on several OS threads) and, when the cuda test
device is on (tests/support/devices.py), through ``torch.ops.dynemb`` on GPU copies of every
tensor (``OnGpu``: the CUDA executor, its kernels racing on thousands of threads).
Whatever the docs promise to be independent of the thread count must be identical:
table contents (digests, keys, scores, timestamps, rows, overflow flags), statuses,
counts, evictions, outputs, dedup ids, pooled bags and optimizer updates. Batches are
large enough for the CPU to split them over threads, tables small enough to fill,
evict, spill and fail.
"""

from functools import partial

import dynemb._C  # noqa: F401  (loads both op libraries)
import pytest
import torch

from dynemb import _ops
from tests.support import reference as ref
from tests.support.executor_parity import (
    CACHE,
    CPU,
    CUSTOMIZED,
    DIM,
    EMULATED,
    EVICT_ANY,
    GPU,
    LFU,
    NO_EVICTION,
    NO_PINS,
    ROW,
    STEP,
    TIMESTAMP,
    TIMESTAMP_LFU,
    UNIFORM_INIT,
    assert_same,
    assign_outputs,
    claim_outputs,
    copy_table,
    find_or_insert_outputs,
    key_batches,
    parity_table,
    run_on_every_executor,
)

pytestmark = pytest.mark.no_emulated_pass(
    "runs the CPU and the emulated executor side by side itself: the same run in both passes"
)


@pytest.fixture(params=[1, 2], ids=["cpu-1-thread", "cpu-2-threads"])
def cpu_threads(request):
    previous = _ops.set_thread_limit(request.param)
    yield request.param
    _ops.set_thread_limit(previous)


@pytest.mark.parametrize("strategy", [TIMESTAMP, STEP, CUSTOMIZED, LFU, TIMESTAMP_LFU, CACHE])
@pytest.mark.parametrize("fast_slots", [None, 40], ids=["one-tier", "two-tiers"])
def test_find_or_insert_and_assign_with_evictions(strategy, fast_slots, cpu_threads):
    table = parity_table(strategy, num_buckets=8, fast_slots=fast_slots)  # 128 slots
    for b, keys in enumerate(key_batches(1, 5000, 3000, 3)):
        policy = [strategy, 10 + b, 7, EVICT_ANY, DIM, 1 + b, 1 + b]  # pins: this batch's
        g = torch.Generator().manual_seed(b)
        scores = torch.randint(0, 1000, keys.shape, generator=g) if strategy == CUSTOMIZED else None
        table = run_on_every_executor(
            table, partial(find_or_insert_outputs, policy=policy, keys=keys, scores=scores)
        )
        rows = torch.randn(keys.numel(), DIM, generator=g)
        table = run_on_every_executor(
            table, partial(assign_outputs, policy=policy, keys=keys, scores=scores, rows=rows)
        )


@pytest.mark.parametrize("strategy", [TIMESTAMP, LFU, NO_EVICTION])
def test_one_bucket_windows_are_decided_in_pass_one(strategy, cpu_threads):
    """Where a key's window is its home bucket alone (an evicting strategy; a table of
    one bucket), the CUDA executor's pass 1 decides the keys the CPU leaves to pass 2
    (full or flagged home buckets, repeats of keys placed there): same outcome. The
    overflow flags of an evicting table are set by hand (its own upserts never set them)."""
    buckets = 1 if strategy == NO_EVICTION else 8
    table = parity_table(strategy, num_buckets=buckets)
    evict = EVICT_ANY if strategy != NO_EVICTION else 0
    for b, keys in enumerate(key_batches(5, 300, 400, 3)):
        if b == 1 and strategy != NO_EVICTION:
            table[6][::2] = 1
        keys = torch.cat([keys, keys[:40]])  # repeats, after their first
        policy = [strategy, 10 + b, 7, evict, DIM, 1 + b, 1 + b]
        table = run_on_every_executor(
            table, partial(find_or_insert_outputs, policy=policy, keys=keys, scores=None)
        )
    # The flags set by hand stay (an evicting table's upserts neither read nor clear them);
    # a table of one bucket has no second bucket to flag.
    assert table[6].any() == (strategy != NO_EVICTION)


@pytest.mark.parametrize("strategy", [LFU, CACHE, NO_EVICTION])
def test_slot_claims_with_accesses_and_pins(strategy, cpu_threads):
    table = parity_table(strategy, num_buckets=16)
    for b, raw in enumerate(key_batches(2, 6000, 4000, 3)):
        keys, _, counts = torch.ops.dynemb.unique_keys(raw)
        evict = EVICT_ANY if strategy != NO_EVICTION else 0
        # Pins: this batch's and the previous one's are in flight.
        policy = [strategy, 1 + b, 3, evict, DIM, 1 + b, max(b, 1)]
        live = None
        if b % 2:  # padded: other keys after the live ones, which no executor may touch
            live = torch.tensor([keys.numel()])
            keys = torch.cat([keys, raw[:500] + 7])
            counts = torch.cat([counts, torch.ones(500, dtype=torch.int64)])
        step = partial(claim_outputs, policy=policy, keys=keys, counts=counts, live=live)
        table = run_on_every_executor(table, step)


def test_no_eviction_spills_rehash_and_erase(cpu_threads):
    """A NO_EVICTION table filled in batches (keys choosing their home below 13/16, else
    the emptier of two buckets, as a batch starts; second buckets, overflow flags and failures at full capacity),
    grown by rehash, then erased from."""
    table = parity_table(NO_EVICTION, num_buckets=64)  # 1024 slots
    policy = [NO_EVICTION, 0, 5, 0, DIM, 0, NO_PINS]
    for keys in key_batches(3, 400, 1 << 40, 4):
        table = run_on_every_executor(
            table,
            lambda lib, t, keys=keys: list(
                lib.table_find_or_insert(
                    t, policy, UNIFORM_INIT, keys, None, torch.empty(keys.numel(), ROW), []
                )
            ),
        )
    assert table[6].any(), "the batch should have overflowed some buckets"
    bigger = parity_table(NO_EVICTION, num_buckets=128)

    def rehash(lib, t):
        dst = copy_table(bigger)
        failed = lib.table_rehash(t, dst, 2)
        return [failed] + dst

    run_on_every_executor(table, rehash)
    grown = copy_table(bigger)
    CPU.table_rehash(table, grown, 2)
    erase_keys = torch.cat([key_batches(3, 400, 1 << 40, 4)[2][::3], torch.arange(100)])
    erase_keys = torch.cat([erase_keys, erase_keys[:50]])  # repeats: the first reports
    run_on_every_executor(grown, lambda lib, t: [lib.table_erase(t, erase_keys)])


def test_no_eviction_chains_rehash_and_erase(cpu_threads):
    """Keys past overflowed home buckets: a full table rehashed into one of its size
    (its second pass places what its home buckets cannot hold, and fails some), and
    erased from where keys sit along their chains (the erase's second pass)."""
    table = parity_table(NO_EVICTION, num_buckets=64)  # 1024 slots
    policy = [NO_EVICTION, 0, 5, 0, DIM, 0, NO_PINS]
    keys = key_batches(4, 1100, 1 << 40, 1)[0]
    out = torch.empty(keys.numel(), ROW)
    status, _ = CPU.table_find_or_insert(table, policy, UNIFORM_INIT, keys, None, out, [])
    assert table[6].sum() > 8, "keys should sit past overflowed home buckets"
    same = parity_table(NO_EVICTION, num_buckets=64)

    def rehash(lib, t):
        dst = copy_table(same)
        failed = lib.table_rehash(t, dst, 2)
        return [failed] + dst

    run_on_every_executor(table, rehash)
    stored = keys[status != 3]  # every stored key, repeats and never-stored ones beside
    erase_keys = torch.cat([stored[::2], keys[status == 3][:20], stored[:40], torch.arange(50)])
    run_on_every_executor(table, lambda lib, t: [lib.table_erase(t, erase_keys)])
    erased = CPU.table_erase(copy_table(table), erase_keys)
    assert int(erased.sum()) == torch.unique(torch.cat([stored[::2], stored[:40]])).numel()


def test_no_eviction_erase_split_over_threads(cpu_threads):
    """An erase batch large enough for the CPU to split it over threads (pass 1 per
    home-bucket range, pass 2 for keys past flagged homes on one thread), on a nearly
    full NO_EVICTION table with keys in their second buckets; repeats, absent keys."""
    table = parity_table(NO_EVICTION, num_buckets=1024)  # 16384 slots
    policy = [NO_EVICTION, 0, 5, 0, DIM, 0, NO_PINS]
    keys = key_batches(5, 15000, 1 << 40, 1)[0]
    status, _ = CPU.table_find_or_insert(
        table, policy, UNIFORM_INIT, keys, None, torch.empty(keys.numel(), ROW), []
    )
    assert table[6].sum() > 100, "keys should sit in second buckets"
    stored = keys[status != 3]
    erase_keys = torch.cat([stored[::2], stored[:3000], torch.arange(2000)])
    assert erase_keys.numel() >= 2 * 2048, "the CPU splits a batch of 2 * kGrain keys or more"
    run_on_every_executor(table, lambda lib, t: [lib.table_erase(t, erase_keys)])
    erased = CPU.table_erase(copy_table(table), erase_keys)
    assert int(erased.sum()) == torch.unique(torch.cat([stored[::2], stored[:3000]])).numel()


# NO_EVICTION: 5,000 keys in 512 slots, so pass 2 makes room by moving residents (one
# move or a chain of two; csrc/core/tile_room.h), rows across a hybrid table's tiers too.
@pytest.mark.parametrize(
    "strategy, fast_slots",
    [(TIMESTAMP_LFU, None), (CUSTOMIZED, None), (NO_EVICTION, None), (NO_EVICTION, 200)],
)
def test_restore(strategy, fast_slots, cpu_threads):
    table = parity_table(strategy, num_buckets=32, fast_slots=fast_slots)
    g = torch.Generator().manual_seed(4)
    keys = torch.randint(0, 1 << 50, (5000,), generator=g)
    values = torch.randn(5000, DIM, generator=g)
    state = torch.randn(5000, ROW - DIM, generator=g)
    scores = torch.randint(0, 1 << 40, (5000,), generator=g) if strategy != NO_EVICTION else None
    stamps = torch.randint(0, 1 << 40, (5000,), generator=g) if strategy == TIMESTAMP_LFU else None
    policy = [strategy, 9, 1, EVICT_ANY if strategy != NO_EVICTION else 0, DIM, 0, NO_PINS]
    run_on_every_executor(
        table,
        lambda lib, t: list(
            lib.table_restore(t, policy, UNIFORM_INIT, keys, values, state, scores, stamps, [])
        ),
    )


def _lost_without_moves(keys, num_buckets, bucket_capacity):
    """Keys a restore of distinct `keys` into an empty NO_EVICTION table loses without
    moves: pass 0 sends each key home (home_takes_new_keys), pass 1 fills each home in
    batch order, pass 2 tries the home, then the second bucket (core tile_upsert_spill)."""
    fill, deferred = [0] * num_buckets, []
    for k in keys.tolist():
        home = ref.bucket_of(k, num_buckets)
        if fill[home] < bucket_capacity:
            fill[home] += 1
        else:
            deferred.append(k)
    lost = 0
    for k in deferred:
        second = ref.second_bucket_of(k, num_buckets)
        if fill[second] < bucket_capacity:
            fill[second] += 1
        else:
            lost += 1
    return lost


@pytest.mark.parametrize("n, seed", [(505, 4), (510, 6)], ids=["505", "510"])
@pytest.mark.parametrize("fast_slots", [None, 200])
def test_a_restore_makes_room_by_moving_residents(fast_slots, n, seed, cpu_threads):
    """505 or 510 keys into 512 slots: pass 2 places every key, some only in a slot freed
    by moving residents (one move, or a chain of two or three) with their rows, the same
    on every executor. The 510 keys need a chain of three: with chains of at most two,
    one of them found no room."""
    table = parity_table(NO_EVICTION, num_buckets=32, fast_slots=fast_slots)
    g = torch.Generator().manual_seed(seed)
    keys = torch.randint(0, 1 << 50, (n,), generator=g)
    assert keys.unique().numel() == n
    assert _lost_without_moves(keys, 32, 16) > 0  # the moves are needed
    values = torch.randn(n, DIM, generator=g)
    state = torch.randn(n, ROW - DIM, generator=g)
    policy = [NO_EVICTION, 9, 1, 0, DIM, 0, NO_PINS]
    restored = run_on_every_executor(
        table,
        lambda lib, t: list(
            lib.table_restore(t, policy, UNIFORM_INIT, keys, values, state, None, None, [])
        ),
    )
    slots = CPU.table_find_slots(restored, keys)
    assert bool((slots >= 0).all())
    rows = torch.cat([restored[4], restored[7]])[slots]  # fast rows, then the slow tier's
    assert torch.equal(rows, torch.cat([values, state], 1))  # each key its own row


def test_unique_keys(cpu_threads):
    for keys in key_batches(5, 20000, 3000, 2) + [torch.tensor([], dtype=torch.int64)]:
        expected = list(CPU.unique_keys(keys))
        for lib in (EMULATED, GPU) if GPU else (EMULATED,):
            assert_same(expected, list(lib.unique_keys(keys)), "unique_keys")


# FTRL's fields: learning_rate_power (-0.5: the square root; -0.3: powf), beta, l1, l2.
FTRL_FIELDS = {4: [-0.5, 1.0, 0.02, 0.01], 5: [-0.3, 0.5, 0.02, 0.0]}


@pytest.mark.parametrize(
    "optimizer", [0, 1, 2, 3, 4, 5], ids=["sgd", "adagrad", "rowwise", "adam", "ftrl", "ftrl-pow"]
)
@pytest.mark.parametrize("mode", [0, 1], ids=["sum", "mean"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
# dims 64 and 16: the CPU executor's register kernels (csrc/cpu/row_lanes.h; 16: two
# registers a row), weighted or not; 20: sum_of_squares' lanes with a remainder; 4: the
# run-time dim loops.
@pytest.mark.parametrize(
    "dim, weighted", [(4, True), (64, True), (64, False), (16, False), (20, False)],
    ids=["dim4-weighted", "dim64-weighted", "dim64", "dim16", "dim20"],
)  # fmt: skip
def test_pool_gather_and_backward(optimizer, mode, dtype, dim, weighted, cpu_threads):
    row = dim + {0: 0, 1: dim, 2: 1, 3: 2 * dim, 4: 2 * dim, 5: 2 * dim}[optimizer]
    g = torch.Generator().manual_seed(6)
    num_bags = 3000
    lengths = torch.randint(0, 6, (num_bags,), generator=g)
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
    keys = torch.randint(0, 2000, (int(offsets[-1]),), generator=g)
    # Hot keys: several gradient chunks (core kGradientChunk: 64), one just over a chunk.
    keys[::19] = 7
    keys[5::113] = 11  # ~66 indices
    weights = torch.rand(keys.numel(), generator=g) if weighted else None
    grad = torch.randn(num_bags, dim, generator=g)
    table = parity_table(
        LFU, num_buckets=64, fast_slots=700, dtype=dtype
    )  # some keys fail: slot -1
    table[4] = torch.zeros(700, row, dtype=dtype)
    table[7] = torch.zeros(1024 - 700, row, dtype=dtype)
    unique, inverse, counts = CPU.unique_keys(keys)
    slots, _, _ = CPU.table_find_or_insert_slots(
        table, [LFU, 1, 2, 0, dim, 1, 1], UNIFORM_INIT, unique, None, counts, True, None
    )
    assert (slots < 0).any() and (slots >= 0).any()  # bags with and without missing rows
    opt = [float(min(optimizer, 4)), 0.05, 1e-8, 0.9, 0.99, 0.01]
    opt += FTRL_FIELDS.get(optimizer, [])

    def step(lib, t):
        pooled = lib.embedding_pool(
            t, slots[inverse], keys, offsets, weights, mode, UNIFORM_INIT, 2, dim
        )
        rows = lib.embedding_gather(t, slots[inverse], keys, UNIFORM_INIT, 2, dim)
        lib.embedding_backward(t, slots, inverse, offsets, weights, mode, grad, opt, 3, dim)
        return [pooled, rows]

    run_on_every_executor(table, step)


def _exchange(lib, t, slow, user_scores, keys, slots, status, evicted_keys):
    scores = user_scores.clone()
    out = lib.table_cache_exchange(
        t, slow, UNIFORM_INIT, 0, DIM, scores, keys, slots, status, evicted_keys
    )
    return list(out) + [scores]


def test_cache_exchange(cpu_threads):
    cache = parity_table(CACHE, num_buckets=8)
    slow = parity_table(LFU, num_buckets=64)
    g = torch.Generator().manual_seed(7)
    stored = torch.randint(0, 5000, (600,), generator=g).unique()
    CPU.table_insert_or_assign(
        slow,
        [LFU, 1, 0, EVICT_ANY, DIM, 0, NO_PINS],
        UNIFORM_INIT,
        stored,
        None,
        torch.randn(stored.numel(), DIM, generator=g),
        [],
    )
    user_scores = torch.zeros(128, dtype=torch.int64)
    for b, raw in enumerate(key_batches(8, 300, 5000, 4)):
        keys = CPU.unique_keys(raw)[0]
        evicted_keys = torch.zeros_like(keys)
        # The floor pins the batch's own keys (a cache tier's claim): each slot moves once.
        slots, status, _ = CPU.table_find_or_insert_slots(
            cache,
            [CACHE, 1 + b, 0, 1 + b, DIM, 0, NO_PINS],
            UNIFORM_INIT,
            keys,
            None,
            None,
            False,
            evicted_keys,
        )
        assert b == 0 or (status == 2).any(), "keys should evict residents of earlier batches"

        step = partial(
            _exchange,
            slow=slow,
            user_scores=user_scores,
            keys=keys,
            slots=slots,
            status=status,
            evicted_keys=evicted_keys,
        )
        cache = run_on_every_executor(cache, step)
        CPU.table_cache_exchange(
            copy_table(cache),
            slow,
            UNIFORM_INIT,
            0,
            DIM,
            user_scores,
            keys,
            slots,
            status,
            evicted_keys,
        )
