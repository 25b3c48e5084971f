"""KVCounter under threads: concurrent adds lose no count (every public op takes the
counter's lock), and the lock does not keep a counter, or a module holding one, from
being deep-copied or pickled."""

import copy
import pickle
import threading

import pytest
import torch

from dynemb import (
    BatchedDynamicEmbeddingTables,
    DynamicEmbPoolingMode,
    DynamicEmbTableOptions,
)
from dynemb.admission_strategies import FrequencyAdmissionStrategy, KVCounter
from dynemb.table.rw_lock import RWLock

KEYS, THREADS, ADDS = 1000, 2, 50


def counts_of(counter: KVCounter) -> dict:
    keys, counts = counter.dump()
    return dict(zip(keys.tolist(), counts.tolist()))


def run_threads(*targets) -> None:
    start = threading.Barrier(len(targets))
    errors = []

    def body(target):
        try:
            start.wait()
            target()
        except BaseException as e:  # re-raised in the main thread
            errors.append(e)

    threads = [threading.Thread(target=body, args=(t,)) for t in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


@pytest.mark.parametrize("attempt", range(3))
def test_concurrent_adds_count_every_key_exactly(attempt):
    c = KVCounter(capacity=4 * KEYS, bucket_capacity=16)
    keys = torch.arange(KEYS)

    def adds():
        for _ in range(ADDS):
            c.add(keys)

    run_threads(*[adds] * THREADS)
    assert counts_of(c) == {k: THREADS * ADDS for k in range(KEYS)}
    assert c.size() == KEYS


def test_reads_and_loads_beside_adds_see_whole_adds():
    """dump, size, memory_usage, erase and load run beside adds; each add is whole: the
    keys an add touches (all of them at once) always share one count."""
    c = KVCounter(capacity=4 * KEYS, bucket_capacity=16)
    keys = torch.arange(KEYS)
    c.add(keys)
    seen = []

    def adds():
        for _ in range(ADDS):
            c.add(keys)

    def readers():
        for i in range(ADDS):
            dumped = counts_of(c)
            seen.append(set(dumped.values()))
            assert c.size() == KEYS and c.memory_usage() > 0
            # Erasing and reloading a key with its own count keeps the totals.
            c.load(torch.tensor([KEYS + i]), torch.tensor([1]))
            c.erase(torch.tensor([KEYS + i]))

    run_threads(adds, readers)
    assert all(len(s) == 1 for s in seen), seen
    assert counts_of(c) == {k: 1 + ADDS for k in range(KEYS)}


@pytest.mark.parametrize("copier", [copy.deepcopy, lambda x: pickle.loads(pickle.dumps(x))])
def test_counter_copies_keep_counts_and_their_own_lock(copier):
    c = KVCounter(capacity=64, bucket_capacity=16)
    assert counts_of(copier(c)) == {}  # before its table exists
    c.add(torch.tensor([7, 8, 7]))
    d = copier(c)
    assert counts_of(d) == {7: 2, 8: 1}
    d.add(torch.tensor([7]))  # the copy's lock is its own, usable and not held
    assert counts_of(d) == {7: 3, 8: 1} and counts_of(c) == {7: 2, 8: 1}
    run_threads(*[lambda: d.add(torch.arange(10))] * THREADS)
    assert counts_of(d)[0] == THREADS


def test_options_and_module_holding_a_counter_copy():
    """A counter travels inside DynamicEmbTableOptions (pickled with a plan) and inside
    the module that counts with it; neither copy is refused for its lock."""
    opts = DynamicEmbTableOptions(
        dim=4, max_capacity=256, bucket_capacity=16,
        admit_strategy=FrequencyAdmissionStrategy(
            3, counter=KVCounter(capacity=64, bucket_capacity=16)
        ),
    )  # fmt: skip
    opts.admit_strategy.counter.add(torch.tensor([1]))
    for copied in (copy.deepcopy(opts), pickle.loads(pickle.dumps(opts))):
        assert counts_of(copied.admit_strategy.counter) == {1: 1}
    m = BatchedDynamicEmbeddingTables(
        [opts], feature_table_map=[0], pooling_mode=DynamicEmbPoolingMode.SUM
    )
    m(torch.tensor([5, 5, 6]), torch.tensor([0, 3]))
    # The tables' own locks are not copied by deepcopy (a copy takes fresh ones, as in
    # tests/deltas/test_delta_background.py); the counter's lock needs no such help.
    m2 = copy.deepcopy(m, memo={id(t.lock): RWLock() for t in m.tables})
    assert counts_of(m2.admission_counters[0]) == {5: 2, 6: 1}
    m2(torch.tensor([5]), torch.tensor([0, 1]))
    assert counts_of(m2.admission_counters[0]) == {6: 1}  # 5 admitted: no longer counted
    assert counts_of(m.admission_counters[0]) == {5: 2, 6: 1}
