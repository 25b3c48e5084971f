"""Rank-side code of tests/shard/test_dropped_forwards.py: a DMP model runs training
forwards whose graphs are dropped without a backward, then trains a step."""

import gc

from dynemb.table.pin_ledger import PinHold
from dynemb.tiering import CachedTable
from dynemb.tiering.batch_ledger import BatchHold
from tests.support.sharded_workers import (
    Case,
    build_model,
    dynamic_tables,
    global_batch,
    local_kjt,
    out_grad,
)

BATCH = 4  # samples per rank


class CollectingLock:
    """A ledger's lock that runs the cyclic collector right after each acquire: what
    an allocation inside the locked region may make it do at any time."""

    def __init__(self, lock) -> None:
        self.lock = lock

    def __enter__(self):
        self.lock.__enter__()
        gc.collect()
        return self

    def __exit__(self, *exc):
        return self.lock.__exit__(*exc)


def _collect_inside_ledgers(model) -> None:
    for table in dynamic_tables(model).values():
        if isinstance(table, CachedTable):
            ledgers = [table.cache.state.pins, table.state.batches]
        else:
            ledgers = [table.state.pins]
        for ledger in ledgers:
            ledger._lock = CollectingLock(ledger._lock)


def forwards_without_backward(
    rank: int, world_size: int, case: Case, forwards: int, collect_inside_ledgers: bool
) -> list:
    """``forwards`` training forwards dropped unused (each graph in a reference cycle,
    which only the cyclic collector frees), then one step with a backward. With
    ``collect_inside_ledgers``, the collector runs inside every ledger call's locked
    region; else where an allocation triggers it. Returns, per table, its batches in
    flight after the step and its holds still referenced by some object."""
    model = build_model(case, world_size)
    if collect_inside_ledgers:
        _collect_inside_ledgers(model)
        gc.freeze()  # the collections skip what exists now (imports, the model): faster
    total, start = BATCH * world_size, BATCH * rank
    for step in range(forwards + 1):
        lengths, keys, weights = global_batch(step, total, case.weighted)
        values = model(local_kjt(lengths, keys, weights, start, start + BATCH)).values()
        loss = (values * out_grad(step, total, values.shape[1])[start : start + BATCH]).sum()
        if step < forwards:  # an evaluation that forgot model.eval(): no backward
            cycle = [loss]
            cycle.append(cycle)
            del values, loss, cycle
            continue
        loss.backward()
    gc.collect()
    return [(t.batches_in_flight(), _holds_alive(t)) for t in dynamic_tables(model).values()]


def _holds_alive(table) -> int:
    """The table's batch holds that some object still references (unreleased)."""
    if isinstance(table, CachedTable):
        kind, ledger = BatchHold, table.state.batches
    else:
        kind, ledger = PinHold, table.state.pins
    return sum(1 for o in gc.get_objects() if isinstance(o, kind) and o._ledger is ledger)
