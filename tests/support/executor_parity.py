"""The executor-parity harness: one table op sequence run on the CPU library, the
emulated CUDA one (and the GPU with the cuda test device), outputs and tables compared
bit for bit; the ops' argument builders and the tables they run on."""

import dynemb._C  # noqa: F401  (loads both op libraries)
import torch

from dynemb import _ops
from tests.support.devices import test_devices

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


def parity_table(strategy, num_buckets, bucket_capacity=16, fast_slots=None, dtype=torch.float32):
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


def copy_table(table):
    return [t.clone() for t in table]


def assert_same(a, b, what):
    if isinstance(a, (list, tuple)):
        assert len(a) == len(b), what
        for k, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{what}[{k}]")
    elif isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape, what
        assert torch.equal(a, b), f"{what} differs between the executors"
    else:
        assert a == b, what


def key_batches(seed, n, key_range, batches):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, key_range, (n,), generator=g) for _ in range(batches)]


def run_on_every_executor(table, step):
    """step(lib, table) -> outputs, on the CPU library and on the emulated one (and on
    the GPU, with the cuda test device)."""
    cpu_table = copy_table(table)
    cpu_out = step(CPU, cpu_table)
    for name, lib in (("emulated", EMULATED), ("cuda", GPU)):
        if lib is None:
            continue
        other_table = copy_table(table)
        other_out = step(lib, other_table)
        assert_same(cpu_out, other_out, f"outputs (cpu vs {name})")
        assert_same(cpu_table, other_table, f"table (cpu vs {name})")
    return cpu_table


def find_or_insert_outputs(lib, t, policy, keys, scores):
    values = torch.empty(keys.numel(), ROW)
    evicted = [torch.zeros_like(keys), torch.zeros(keys.numel(), ROW), torch.zeros_like(keys)]
    status, counts = lib.table_find_or_insert(
        t, policy, UNIFORM_INIT, keys, scores, values, evicted
    )
    found = torch.empty(keys.numel(), ROW)
    hit = lib.table_find(t, keys, found)
    return [status, counts, values, evicted, hit, found, lib.table_find_slots(t, keys)]


def assign_outputs(lib, t, policy, keys, scores, rows):
    return list(lib.table_insert_or_assign(t, policy, UNIFORM_INIT, keys, scores, rows, []))


def claim_outputs(lib, t, policy, keys, counts, live=None):
    """A claim; with ``live``, of the first ``live`` keys (a padded batch): the slots and
    statuses past them are unspecified, the evicted keys there must stay untouched."""
    evicted_keys = torch.zeros_like(keys)
    slots, status, totals = lib.table_find_or_insert_slots(
        t, policy, UNIFORM_INIT, keys, None, counts, True, evicted_keys, live
    )
    u = keys.numel() if live is None else int(live)
    return [slots[:u], status[:u], totals, evicted_keys]
