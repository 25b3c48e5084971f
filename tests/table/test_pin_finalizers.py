"""A batch hold collected unreleased never takes a lock (pin_ledger.py).

The cyclic collector may run at any allocation of a thread, also inside a locked
region of that thread: a finalizer (``__del__``, a weak-reference callback) that
takes the ledger's lock there would wait on its own thread forever. So a hold
dropped while its ledger's lock is held must end at the ledger's next call.
Each case runs in a thread joined with a timeout: a deadlock fails, never hangs.
"""

import ast
import gc
import pathlib
import threading

import torch

import dynemb
from dynemb import DynamicEmbScoreStrategy, DynamicEmbTableOptions
from dynemb.optimizer import EmbOptimType
from dynemb.table.pin_ledger import PinLedger

DEADLINE_S = 20.0


def _finishes(fn) -> None:
    errors = []

    def run():
        try:
            fn()
        except BaseException as e:  # reported below
            errors.append(e)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(DEADLINE_S)
    assert not thread.is_alive(), "deadlock: a collected hold waited on its own ledger's lock"
    if errors:
        raise errors[0]


def _cyclic_hold(ledger: PinLedger, pins: torch.Tensor) -> None:
    """A hold reachable only through a reference cycle (as an autograd graph dropped
    unused can be): only the cyclic collector frees it."""
    cycle = [ledger.hold(pins)]
    cycle.append(cycle)


def test_a_hold_freed_inside_the_ledgers_lock_ends_at_its_next_call():
    ledger = PinLedger()
    pins = torch.zeros(4, dtype=torch.int32)
    kept = ledger.hold(pins)
    dropped = ledger.hold(pins)

    def drop_inside_the_lock():
        nonlocal dropped
        with ledger._lock:
            dropped = None  # the last reference: freed right here, lock held

    _finishes(drop_inside_the_lock)
    assert ledger.in_flight() == 1 and ledger.floor() == kept.number
    kept.release()
    assert ledger.in_flight() == 0 and ledger.floor() == ledger.hold(pins).number


def test_the_cyclic_collector_inside_every_locked_call_frees_holds():
    """gc.collect() inside the locked region of each ledger call (as an allocation
    there may trigger it), with unreleased holds in cycles waiting."""
    ledger = PinLedger()
    pins = torch.zeros(4, dtype=torch.int32)

    def collect_inside_the_lock():
        gc.disable()
        try:
            for _ in range(3):
                _cyclic_hold(ledger, pins)
            with ledger._lock:
                gc.collect()
            for _ in range(3):
                _cyclic_hold(ledger, pins)
        finally:
            gc.enable()

    _finishes(collect_inside_the_lock)
    gc.collect()
    assert ledger.in_flight() == 0
    assert ledger.floor() == ledger.hold(pins).number  # no stale hold lowers the floor


def test_renumbering_skips_holds_collected_during_it():
    ledger = PinLedger(limit=6)
    pins = torch.zeros(4, dtype=torch.int32)

    def fill_and_collect():
        gc.disable()
        try:
            _cyclic_hold(ledger, pins)
            _cyclic_hold(ledger, pins)  # 1, 2: collected below
            kept = [ledger.hold(pins) for _ in range(2)]  # 3, 4
            _cyclic_hold(ledger, pins)  # 5; the next hold renumbers
            with ledger._lock:
                gc.collect()
            new = ledger.hold(pins)  # the floor is 3: 3 -> 1, 4 -> 2, then 4
            assert [h.number for h in kept] == [1, 2] and new.number == 4
        finally:
            gc.enable()

    _finishes(fill_and_collect)


def test_a_dropped_training_graph_collected_inside_the_ledgers_lock():
    """The module's own holds: training forwards whose outputs sit in cycles, collected
    inside the table's ledger lock; the table keeps training afterwards."""
    options = DynamicEmbTableOptions(
        dim=4, max_capacity=64, bucket_capacity=16, score_strategy=DynamicEmbScoreStrategy.LFU
    )
    module = dynemb.BatchedDynamicEmbeddingTables(
        [options], [0], optimizer=EmbOptimType.EXACT_SGD, learning_rate=1.0
    )
    ledger = module.tables[0].state.pins
    keys, offsets = torch.arange(8), torch.arange(9)

    def forwards_dropped_in_cycles():
        gc.disable()
        try:
            for _ in range(5):
                out = module(keys, offsets)
                cycle = [out]
                cycle.append(cycle)
            del out, cycle
            assert ledger.in_flight() == 5
            with ledger._lock:
                gc.collect()
            module(keys, offsets).sum().backward()
        finally:
            gc.enable()

    _finishes(forwards_dropped_in_cycles)
    assert ledger.in_flight() == 0


# Every finalizer of the package, and why it may run inside any locked region of its
# thread. A new one must be added here after the same audit.
AUDITED_FINALIZERS = {
    # queues (number, payload) on a deque (an atomic append); the ledger drains it
    ("dynemb/tiering/batch_ledger.py", "BatchHold"),
    # cudaHostUnregister after a device synchronize: no Python lock of the package
    ("dynemb/table/host_memory.py", "PageLock"),
    # os.close of the directory's lock file (releases its flock; never waits)
    ("dynemb/table/spill_files.py", "SpillDirectory"),
}


def test_every_finalizer_of_the_package_is_audited():
    root = pathlib.Path(dynemb.__file__).parent
    found = set()
    for path in root.rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                if any(isinstance(f, ast.FunctionDef) and f.name == "__del__" for f in node.body):
                    found.add((f"dynemb/{path.relative_to(root).as_posix()}", node.name))
            if isinstance(node, ast.Attribute) and node.attr == "finalize":
                found.add((f"dynemb/{path.relative_to(root).as_posix()}", "weakref.finalize"))
    assert found == AUDITED_FINALIZERS
