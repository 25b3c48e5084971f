"""No key reads or trains another key's row (csrc/core/table_ops.h, "Pins").

A key that a batch looks up is never evicted by another key of the same batch,
wherever the two stand in the batch, nor by a later batch before the first one's
backward: a new key whose bucket holds only such keys fails (counted, reported,
it reads the eval initializer's row and its gradient goes nowhere). Checked with
EXACT_SGD at learning rate 1 and loss ``out.sum()``: each lookup moves its key's row
by exactly -1 per element, so a shadow of the stored rows predicts every row.
"""

import gc
import threading

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import dynemb
from dynemb.table.pin_ledger import PinLedger
from tests.support.batch_pins import (
    CONSTANT,
    S,
    check_own_rows,
    initial_rows,
    lookup_rows,
    pin_module,
    stored_rows,
)


def test_a_batch_larger_than_the_table_never_lends_rows():
    """2,000 distinct keys into 256 slots: 256 stored, each moved by one step; the
    1,744 others failed (counted), read zeros and trained nothing."""
    module = pin_module(S.TIMESTAMP, 256, 128)
    keys = torch.randperm(1 << 20, generator=torch.Generator().manual_seed(0))[:2000] + 7
    init = initial_rows(keys)
    out = lookup_rows(module, keys)
    out.sum().backward()
    after = stored_rows(module)
    assert len(after) == 256
    assert module.safe_check_failures == [1744]
    assert module.tables[0].last_stats.failed == 1744
    check_own_rows(module, keys, out, {}, after, init)


def test_a_hit_is_not_evicted_by_an_earlier_new_key_of_its_batch():
    """The reproducer of a hit reset: key 0, oldest in a full bucket, looked up after
    a new key of its batch keeps its row; another resident leaves."""
    module = pin_module(S.STEP, 16, 16, dim=2, init=CONSTANT)
    lookup_rows(module, torch.arange(16)).sum().backward()  # every row -1
    lookup_rows(module, torch.arange(1, 16)).sum().backward()  # key 0 now the oldest
    out = lookup_rows(module, torch.tensor([100, 0]))
    assert out[1].tolist() == [-1.0, -1.0]
    out.sum().backward()
    after = stored_rows(module)
    assert after[0].tolist() == [-2.0, -2.0] and after[100].tolist() == [-1.0, -1.0]
    assert len(after) == 16


@pytest.mark.parametrize(
    "strategy", [S.LFU, S.TIMESTAMP, S.STEP, S.CUSTOMIZED, (S.TIMESTAMP, S.LFU)]
)
def test_zipf_training_reads_and_trains_own_rows(strategy):
    """A table 4x smaller than a step's distinct keys, Zipf ids, 6 steps: every
    lookup and every update is its own key's (the LFU case lent 25% of lookups)."""
    gen = torch.Generator().manual_seed(1)
    module = pin_module(strategy, 256, 128)
    for _ in range(6):
        ids = torch.distributions.Categorical(
            probs=1.0 / torch.arange(1, 4001, dtype=torch.float64) ** 1.05
        ).sample((1024,))
        keys = (ids * 7919 + int(torch.randint(0, 3, (1,), generator=gen))) % 100003
        before = stored_rows(module)
        init = initial_rows(keys)
        out = lookup_rows(module, keys)
        out.sum().backward()
        check_own_rows(module, keys, out, before, stored_rows(module), init)


def test_forwards_before_one_backward_keep_their_rows():
    """Three forwards (towers) before one backward: a later forward never evicts a
    key an earlier one looked up, so the backward trains each key's own row."""
    module = pin_module(S.TIMESTAMP, 32, 16)
    batches = [torch.arange(t * 100, t * 100 + 24) for t in range(3)]
    inits = [initial_rows(k) for k in batches]
    outs = [lookup_rows(module, k) for k in batches]
    assert module.tables[0].last_stats.failed > 0  # the third batch found no room
    sum(o.sum() for o in outs).backward()
    after = stored_rows(module)
    for keys, out, init in zip(batches, outs, inits, strict=True):
        for i, k in enumerate(keys.tolist()):
            if k in after:
                assert torch.equal(out[i].detach(), init[i])
                assert torch.equal(after[k], init[i] - 1)
            else:
                assert not out[i].any()
    assert all(k in after for k in batches[0].tolist())  # the first forward kept its keys


def test_pins_end_with_the_backward_or_the_dropped_graph():
    module = pin_module(S.LFU, 32, 16)
    ledger = module.tables[0].state.pins
    out = lookup_rows(module, torch.arange(8))
    assert ledger.in_flight() == 1
    out.sum().backward()
    assert ledger.in_flight() == 0
    out = lookup_rows(module, torch.arange(8))
    del out
    gc.collect()
    assert ledger.in_flight() == 0
    with torch.no_grad():
        lookup_rows(module, torch.arange(8))
    assert ledger.in_flight() == 0


def test_pin_numbers_are_renumbered_before_they_run_out():
    """Numbers near the limit: held batches keep their pins (moved down), older
    pins become 0, and the floor keeps pinning exactly the held batches."""
    ledger = PinLedger(limit=8)
    pins = torch.zeros(6, dtype=torch.int32)
    holds = [ledger.hold(pins) for _ in range(7)]  # numbers 1..7
    pins.copy_(torch.tensor([1, 3, 5, 6, 7, 0], dtype=torch.int32))
    for h in holds[:5]:
        h.release()  # 6 and 7 stay in flight
    assert ledger.floor() == 6
    new = ledger.hold(pins)  # renumbers: 6 -> 1, 7 -> 2, the new one 3
    assert [h.number for h in holds[5:]] == [1, 2] and new.number == 3
    assert pins.tolist() == [0, 0, 0, 1, 2, 0]
    assert ledger.floor() == 1


@settings(max_examples=12, deadline=None)
@given(
    strategy=st.sampled_from([S.LFU, S.TIMESTAMP, S.STEP, (S.TIMESTAMP, S.LFU)]),
    buckets=st.integers(1, 4),
    bucket=st.sampled_from([16, 32]),
    seed=st.integers(0, 10**6),
    steps=st.integers(1, 4),
)
def test_random_batches_keep_every_row_its_own(strategy, buckets, bucket, seed, steps):
    gen = torch.Generator().manual_seed(seed)
    module = pin_module(strategy, buckets * bucket, bucket)
    for _ in range(steps):
        n = int(torch.randint(1, 4 * buckets * bucket, (1,), generator=gen))
        keys = torch.randint(0, 3 * buckets * bucket, (n,), generator=gen)
        before = stored_rows(module)
        init = initial_rows(keys)
        out = lookup_rows(module, keys)
        out.sum().backward()
        check_own_rows(module, keys, out, before, stored_rows(module), init)


def test_a_batch_begins_under_the_tables_guard():
    """A hold may renumber the pins buffer in place: it waits for an op in progress
    (here a reader holding the table's guard) and no op runs while it renumbers."""
    table = dynemb.ScoredHashTable(dim=4, capacity=64, bucket_capacity=16, score_strategy=S.LFU)
    state = table._state  # the guard and the ledger under test
    state.pins = PinLedger(limit=4)
    holds = [table.begin_batch() for _ in range(3)]  # numbers 1..3: the next renumbers
    for h in holds[:2]:
        table.end_batch(h)
    began = []
    with state.lock.read():  # an op in progress
        thread = threading.Thread(target=lambda: began.append(table.begin_batch()))
        thread.start()
        thread.join(0.3)
        assert thread.is_alive() and not began, "the hold did not wait for the op"
    thread.join(5)
    assert began and began[0].number == 2 and holds[2].number == 1, "renumbered 3 -> 1"
