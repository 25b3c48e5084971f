"""The CPU executor, the emulated CUDA executor and, with a GPU, the CUDA executor give
the same bits.

Every op runs on copies of the same table: through ``torch.ops.dynemb`` (the CPU
executor, at 1 and 2 threads), through ``torch.ops.dynemb_cuda_emulated`` (csrc/cuda
built for the host, its kernels racing on several OS threads) and, when the cuda test
device is on (tests/devices.py), through ``torch.ops.dynemb`` on GPU copies of every
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
from tests.devices import test_devices

CPU = torch.ops.dynemb
EMULATED = torch.ops.dynemb_cuda_emulated
TABLE_TENSORS, SLOW_VALUES = 9, 7  # a table's tensor list; its slow tier's index


class OnGpu:
    """``torch.ops.dynemb`` run by the CUDA executor on copies of the CPU arguments.

    Each call copies its tensor arguments to the GPU (a table's slow tier to page-locked
    host memory, where the CUDA executor wants it), runs the op there, writes every
    tensor argument back into the CPU tensor it came from (the ops write tables and
    outputs in place) and returns the outputs on the CPU: a drop-in for ``CPU`` in a
    step function.
    """

    def __init__(self, device: str = "cuda"):
        self.device = torch.device(device)

    def _to_device(self, arg, slow=False):
        if isinstance(arg, torch.Tensor):
            return arg.pin_memory() if slow else arg.to(self.device, copy=True)
        if isinstance(arg, (list, tuple)):
            table = len(arg) == TABLE_TENSORS and all(isinstance(a, torch.Tensor) for a in arg)
            return [self._to_device(a, table and k == SLOW_VALUES) for k, a in enumerate(arg)]
        return arg

    def _write_back(self, arg, moved):
        if isinstance(arg, torch.Tensor):
            arg.copy_(moved)
        elif isinstance(arg, (list, tuple)):
            for a, m in zip(arg, moved):
                self._write_back(a, m)

    def _to_cpu(self, out):
        if isinstance(out, torch.Tensor):
            return out.cpu()
        if isinstance(out, (list, tuple)):
            return type(out)(self._to_cpu(o) for o in out)
        return out

    def __getattr__(self, name):
        op = getattr(CPU, name)

        def call(*args):
            moved = [self._to_device(a) for a in args]
            out = op(*moved)
            for arg, m in zip(args, moved):
                self._write_back(arg, m)
            return self._to_cpu(out)

        return call


GPU = OnGpu() if "cuda" in test_devices() else None

TIMESTAMP, STEP, CUSTOMIZED, LFU, NO_EVICTION, TIMESTAMP_LFU, CACHE = range(7)
EVICT_ANY = -1
NO_PINS = _ops.NO_PINS
DIM, ROW = 4, 7  # embedding columns, row width (3 optimizer-state columns)
UNIFORM_INIT = [2.0, -0.5, 0.5, 0.0, 0.0, 0.125, 0.0]


def _table(strategy, num_buckets, bucket_capacity=16, fast_slots=None, dtype=torch.float32):
    slots = num_buckets * bucket_capacity
    fast = slots if fast_slots is None else fast_slots
    keeps_scores = strategy != NO_EVICTION
    return [
        torch.zeros(num_buckets, bucket_capacity, dtype=torch.uint8),
        torch.zeros(slots, dtype=torch.int64),
        torch.zeros(slots if keeps_scores else 0, dtype=torch.int64),
        torch.zeros(slots if strategy == TIMESTAMP_LFU else 0, dtype=torch.int64),
        torch.zeros(fast, ROW, dtype=dtype),
        torch.zeros(num_buckets, dtype=torch.int32),
        torch.zeros(num_buckets, dtype=torch.uint8),
        torch.zeros(slots - fast, ROW, dtype=dtype),
        torch.zeros(slots if keeps_scores else 0, dtype=torch.int32),
    ]


def _copy(table):
    return [t.clone() for t in table]


def _assert_same(a, b, what):
    if isinstance(a, (list, tuple)):
        assert len(a) == len(b), what
        for k, (x, y) in enumerate(zip(a, b)):
            _assert_same(x, y, f"{what}[{k}]")
    elif isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape, what
        assert torch.equal(a, b), f"{what} differs between the executors"
    else:
        assert a == b, what


def _batches(seed, n, key_range, batches):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, key_range, (n,), generator=g) for _ in range(batches)]


@pytest.fixture(params=[1, 2], ids=["cpu-1-thread", "cpu-2-threads"])
def cpu_threads(request):
    previous = _ops.set_thread_limit(request.param)
    yield request.param
    _ops.set_thread_limit(previous)


def _run_both(table, step):
    """step(lib, table) -> outputs, on the CPU library and on the emulated one (and on
    the GPU, with the cuda test device)."""
    cpu_table = _copy(table)
    cpu_out = step(CPU, cpu_table)
    for name, lib in (("emulated", EMULATED), ("cuda", GPU)):
        if lib is None:
            continue
        other_table = _copy(table)
        other_out = step(lib, other_table)
        _assert_same(cpu_out, other_out, f"outputs (cpu vs {name})")
        _assert_same(cpu_table, other_table, f"table (cpu vs {name})")
    return cpu_table


def _find_or_insert(lib, t, policy, keys, scores):
    values = torch.empty(keys.numel(), ROW)
    evicted = [torch.zeros_like(keys), torch.zeros(keys.numel(), ROW), torch.zeros_like(keys)]
    status, counts = lib.table_find_or_insert(
        t, policy, UNIFORM_INIT, keys, scores, values, evicted
    )
    found = torch.empty(keys.numel(), ROW)
    hit = lib.table_find(t, keys, found)
    return [status, counts, values, evicted, hit, found, lib.table_find_slots(t, keys)]


def _assign(lib, t, policy, keys, scores, rows):
    return list(lib.table_insert_or_assign(t, policy, UNIFORM_INIT, keys, scores, rows, []))


def _claim(lib, t, policy, keys, counts, live=None):
    """A claim; with ``live``, of the first ``live`` keys (a padded batch): the slots and
    statuses past them are unspecified, the evicted keys there must stay untouched."""
    evicted_keys = torch.zeros_like(keys)
    slots, status, totals = lib.table_find_or_insert_slots(
        t, policy, UNIFORM_INIT, keys, None, counts, True, evicted_keys, live
    )
    u = keys.numel() if live is None else int(live)
    return [slots[:u], status[:u], totals, evicted_keys]


@pytest.mark.parametrize("strategy", [TIMESTAMP, STEP, CUSTOMIZED, LFU, TIMESTAMP_LFU, CACHE])
@pytest.mark.parametrize("fast_slots", [None, 40], ids=["one-tier", "two-tiers"])
def test_find_or_insert_and_assign_with_evictions(strategy, fast_slots, cpu_threads):
    table = _table(strategy, num_buckets=8, fast_slots=fast_slots)  # 128 slots
    for b, keys in enumerate(_batches(1, 5000, 3000, 3)):
        policy = [strategy, 10 + b, 7, EVICT_ANY, DIM, 1 + b, 1 + b]  # pins: this batch's
        g = torch.Generator().manual_seed(b)
        scores = torch.randint(0, 1000, keys.shape, generator=g) if strategy == CUSTOMIZED else None
        table = _run_both(table, partial(_find_or_insert, policy=policy, keys=keys, scores=scores))
        rows = torch.randn(keys.numel(), DIM, generator=g)
        table = _run_both(
            table, partial(_assign, policy=policy, keys=keys, scores=scores, rows=rows)
        )


@pytest.mark.parametrize("strategy", [LFU, CACHE, NO_EVICTION])
def test_slot_claims_with_accesses_and_pins(strategy, cpu_threads):
    table = _table(strategy, num_buckets=16)
    for b, raw in enumerate(_batches(2, 6000, 4000, 3)):
        keys, _, counts = torch.ops.dynemb.unique_keys(raw)
        evict = EVICT_ANY if strategy != NO_EVICTION else 0
        # Pins: this batch's and the previous one's are in flight.
        policy = [strategy, 1 + b, 3, evict, DIM, 1 + b, max(b, 1)]
        live = None
        if b % 2:  # padded: other keys after the live ones, which no executor may touch
            live = torch.tensor([keys.numel()])
            keys = torch.cat([keys, raw[:500] + 7])
            counts = torch.cat([counts, torch.ones(500, dtype=torch.int64)])
        step = partial(_claim, policy=policy, keys=keys, counts=counts, live=live)
        table = _run_both(table, step)


def test_no_eviction_spills_rehash_and_erase(cpu_threads):
    """A NO_EVICTION table filled past its home buckets (spills, overflow flags and
    failures at full capacity), grown by rehash, then erased from."""
    table = _table(NO_EVICTION, num_buckets=64)  # 1024 slots
    policy = [NO_EVICTION, 0, 5, 0, DIM, 0, NO_PINS]
    for keys in _batches(3, 5000, 1 << 40, 1):
        table = _run_both(
            table,
            lambda lib, t, keys=keys: list(
                lib.table_find_or_insert(
                    t, policy, UNIFORM_INIT, keys, None, torch.empty(keys.numel(), ROW), []
                )
            ),
        )
    assert table[6].any(), "the batch should have overflowed some buckets"
    bigger = _table(NO_EVICTION, num_buckets=128)

    def rehash(lib, t):
        dst = _copy(bigger)
        failed = lib.table_rehash(t, dst, 4)
        return [failed] + dst

    _run_both(table, rehash)
    grown = _copy(bigger)
    CPU.table_rehash(table, grown, 4)
    erase_keys = torch.cat([_batches(3, 5000, 1 << 40, 1)[0][::3], torch.arange(100)])
    erase_keys = torch.cat([erase_keys, erase_keys[:50]])  # repeats: the first reports
    _run_both(grown, lambda lib, t: [lib.table_erase(t, erase_keys)])


def test_no_eviction_chains_rehash_and_erase(cpu_threads):
    """Keys past overflowed home buckets: a full table rehashed into one of its size
    (its second pass places what its home buckets cannot hold, and fails some), and
    erased from where keys sit along their chains (the erase's second pass)."""
    table = _table(NO_EVICTION, num_buckets=64)  # 1024 slots
    policy = [NO_EVICTION, 0, 5, 0, DIM, 0, NO_PINS]
    keys = _batches(4, 1100, 1 << 40, 1)[0]
    out = torch.empty(keys.numel(), ROW)
    status, _ = CPU.table_find_or_insert(table, policy, UNIFORM_INIT, keys, None, out, [])
    assert table[6].sum() > 8, "keys should sit past overflowed home buckets"
    same = _table(NO_EVICTION, num_buckets=64)

    def rehash(lib, t):
        dst = _copy(same)
        failed = lib.table_rehash(t, dst, 2)
        return [failed] + dst

    _run_both(table, rehash)
    stored = keys[status != 3]  # every stored key, repeats and never-stored ones beside
    erase_keys = torch.cat([stored[::2], keys[status == 3][:20], stored[:40], torch.arange(50)])
    _run_both(table, lambda lib, t: [lib.table_erase(t, erase_keys)])
    erased = CPU.table_erase(_copy(table), erase_keys)
    assert int(erased.sum()) == torch.unique(torch.cat([stored[::2], stored[:40]])).numel()


@pytest.mark.parametrize("strategy", [TIMESTAMP_LFU, CUSTOMIZED, NO_EVICTION])
def test_restore(strategy, cpu_threads):
    table = _table(strategy, num_buckets=32)
    g = torch.Generator().manual_seed(4)
    keys = torch.randint(0, 1 << 50, (5000,), generator=g)
    values = torch.randn(5000, DIM, generator=g)
    state = torch.randn(5000, ROW - DIM, generator=g)
    scores = torch.randint(0, 1 << 40, (5000,), generator=g) if strategy != NO_EVICTION else None
    stamps = torch.randint(0, 1 << 40, (5000,), generator=g) if strategy == TIMESTAMP_LFU else None
    policy = [strategy, 9, 1, EVICT_ANY if strategy != NO_EVICTION else 0, DIM, 0, NO_PINS]
    _run_both(
        table,
        lambda lib, t: list(
            lib.table_restore(t, policy, UNIFORM_INIT, keys, values, state, scores, stamps, [])
        ),
    )


def test_unique_keys(cpu_threads):
    for keys in _batches(5, 20000, 3000, 2) + [torch.tensor([], dtype=torch.int64)]:
        expected = list(CPU.unique_keys(keys))
        for lib in (EMULATED, GPU) if GPU else (EMULATED,):
            _assert_same(expected, list(lib.unique_keys(keys)), "unique_keys")


@pytest.mark.parametrize("optimizer", [0, 1, 2, 3], ids=["sgd", "adagrad", "rowwise", "adam"])
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
    row = dim + {0: 0, 1: dim, 2: 1, 3: 2 * dim}[optimizer]
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
    table = _table(LFU, num_buckets=64, fast_slots=700, dtype=dtype)  # some keys fail: slot -1
    table[4] = torch.zeros(700, row, dtype=dtype)
    table[7] = torch.zeros(1024 - 700, row, dtype=dtype)
    unique, inverse, counts = CPU.unique_keys(keys)
    slots, _, _ = CPU.table_find_or_insert_slots(
        table, [LFU, 1, 2, 0, dim, 1, 1], UNIFORM_INIT, unique, None, counts, True, None
    )
    assert (slots < 0).any() and (slots >= 0).any()  # bags with and without missing rows
    opt = [float(optimizer), 0.05, 1e-8, 0.9, 0.99, 0.01]

    def step(lib, t):
        pooled = lib.embedding_pool(
            t, slots[inverse], keys, offsets, weights, mode, UNIFORM_INIT, 2, dim
        )
        rows = lib.embedding_gather(t, slots[inverse], keys, UNIFORM_INIT, 2, dim)
        lib.embedding_backward(t, slots, inverse, offsets, weights, mode, grad, opt, 3, dim)
        return [pooled, rows]

    _run_both(table, step)


def _exchange(lib, t, slow, user_scores, keys, slots, status, evicted_keys):
    scores = user_scores.clone()
    out = lib.table_cache_exchange(
        t, slow, UNIFORM_INIT, 0, DIM, scores, keys, slots, status, evicted_keys
    )
    return list(out) + [scores]


def test_cache_exchange(cpu_threads):
    cache = _table(CACHE, num_buckets=8)
    slow = _table(LFU, num_buckets=64)
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
    for b, raw in enumerate(_batches(8, 300, 5000, 4)):
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
        cache = _run_both(cache, step)
        CPU.table_cache_exchange(
            _copy(cache), slow, UNIFORM_INIT, 0, DIM, user_scores, keys, slots, status, evicted_keys
        )
