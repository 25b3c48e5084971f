"""Training forwards dropped without a backward (forward-only checks, an evaluation
loop without ``model.eval()``, a step a pipeline skips) never hang a DMP model.

Each forward holds its tables' batch until its backward or until its graph is
collected; a collection may run at any allocation, also inside a ledger's locked
region (dynemb/table/pin_ledger.py). 100 such forwards on 2 gloo ranks, in caching
mode too, then a step with a backward: every rank finishes within the timeout, and
the only batches still in flight are those whose holds some object still references
(TorchRec's comm ops keep a few recent requests, and with them their graphs, alive:
torchrec.distributed.comm_ops.Request); every collected one was forgotten.
"""

import pytest

from tests.support.dropped_forwards_workers import forwards_without_backward
from tests.support.multiprocess import run_ranks
from tests.support.sharded_workers import Case

pytestmark = pytest.mark.no_emulated_pass(
    "the ledgers under test are Python; the executor's table ops are the emulated pass's elsewhere"
)

CASES = {
    "in_memory": Case("EXACT_SGD", "roundrobin"),
    "cached": Case("EXACT_SGD", "roundrobin", cache_rows=16),
}


# (dropped forwards, collect inside the ledgers' locks)
RUNS = {"collector_anywhere": (100, False), "collector_in_ledger": (100, True)}


@pytest.mark.parametrize("run", list(RUNS))
@pytest.mark.parametrize("case", list(CASES))
def test_forwards_without_backward_do_not_hang(case, run):
    """``collector_in_ledger``: the collector runs inside every ledger call's locked
    region (where a hold freed by it once waited on that same lock for ever)."""
    forwards, collect = RUNS[run]
    results = run_ranks(forwards_without_backward, 2, CASES[case], forwards, collect, timeout=120)
    for per_table in results:
        for in_flight, alive in per_table:
            assert in_flight == alive < forwards
