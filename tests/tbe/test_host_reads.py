"""A training step's reads of device values (each a wait for the stream on a GPU),
counted by dynemb._host_reads on the CPU and the emulated CUDA executor.

A step reads the device at most twice: once for the batch's layout (the features'
boundaries in ``offsets`` and the checks of its values, in one packed read, which
also takes the previous step's deferred counts) and, on the CUDA executors, once
for the number of distinct keys that sizes ``unique_keys``' outputs. What a step
only counts is deferred to the next read: the status counts of a lookup that
cannot grow its table (admission's lookups and its counter's stores included) and
a cache's statistics (the rows it fetched, the rows its slow tier dropped).

A table with a cache needs its claim's status counts at once, because what it does
next depends on them: whether keys missed (then rows move between the tiers) and
which keys the cache could not take (they are staged, in a staging area sized on
the host). Its claim runs on the padded distinct keys, bounded by their count on
the device (dynemb.table.padded_keys), so that one read takes the claim's counts
and the distinct counts of every table of the step: still two reads. The cache
exchange that follows is sized by the claim's counts, read already.

A lint test keeps every read of the training path's files in ``read_to_host``, so
none goes uncounted.
"""

import ast
import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import dynemb
from dynemb import DynamicEmbPoolingMode, DynamicEmbTableOptions
from dynemb._host_reads import DeferredRead, host_reads, read_to_host
from dynemb.optimizer import EmbOptimType

ROOT = Path(__file__).resolve().parents[2]

# The most reads a step of each scenario (tests/support/host_read_steps.py) may take, per
# executor: the layout read, the distinct count (an op's read, CUDA executors only) and
# what each scenario adds.
BUDGETS = {
    "cpu": {
        "one_table": 1, "eight_tables": 1, "evicting": 1, "caching": 2, "cached_and_plain": 2,
        "admission": 1,
    },
    "cuda-emulated": {
        "one_table": 2, "eight_tables": 2, "evicting": 2, "caching": 2, "cached_and_plain": 2,
        "admission": 2,
    },
}  # fmt: skip


def _reads(executor: str) -> dict[str, list[int]]:
    env = {**os.environ, "DYNEMB_EXECUTOR": executor}
    done = subprocess.run(
        [sys.executable, "-m", "tests.support.host_read_steps"], cwd=ROOT, env=env,
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.no_emulated_pass("runs both executors itself, each in its own process")
@pytest.mark.parametrize("executor", sorted(BUDGETS))
def test_a_training_step_reads_the_device_within_its_budget(executor):
    reads = _reads(executor)
    assert set(reads) == set(BUDGETS[executor])
    over = {name: steps for name, steps in reads.items() if max(steps) > BUDGETS[executor][name]}
    assert not over, f"reads per step over budget {BUDGETS[executor]}: {over}"
    # every step, with a cache or admission or not, reads the device at most twice
    for name, steps in reads.items():
        assert max(steps) <= 2, (name, steps)
        assert min(steps) >= 1, "the layout read is counted"


# The files of the training path: their reads of device values go through read_to_host.
TRAINING_PATH = [
    "dynemb/admission_strategies.py",
    *(f"dynemb/tbe/{name}.py" for name in (
        "batch_layout", "batched_dynamic_embedding_tables", "grouped_calls", "lookup_function",
        "stale_keys", "table_slots",
    )),
    "dynemb/table/padded_keys.py",
    *(f"dynemb/table/{name}.py" for name in (
        "batch_arguments", "entry_transfer", "growth", "scored_hash_table", "slot_access",
        "table_state",
    )),
    *(f"dynemb/tiering/{name}.py" for name in (
        "cache", "cache_fill", "cache_state", "cache_stats", "cached_table", "staging",
    )),
]  # fmt: skip
READS = {"item", "tolist", "cpu", "numpy"}  # methods that copy a tensor's values to the host
CONVERSIONS = {"int", "bool", "float"}  # of a tensor expression: a read
TENSOR_EXPRESSIONS = (ast.Call, ast.Subscript, ast.Compare, ast.UnaryOp)


def _counted(node: ast.AST) -> bool:
    """Whether ``node`` reads through the helper: it calls ``read_to_host`` or a
    deferred read's ``value()``, whose results are host tensors."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.Call):
            f = sub.func
            if isinstance(f, ast.Name) and f.id == "read_to_host":
                return True
            if isinstance(f, ast.Attribute) and f.attr == "value" and not sub.args:
                return True
    return False


def uncounted_reads(source: str) -> list[tuple[int, str]]:
    """``(line, code)`` of each read of tensor values in ``source`` that does not go
    through ``read_to_host``: ``.item()``, ``.tolist()``, ``.cpu()``, ``.numpy()``,
    or ``int``/``bool``/``float`` of a call, subscript, comparison or negation."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Attribute) and f.attr in READS:
            bad = f.attr == "cpu" or f.attr == "numpy" or not _counted(f.value)
        elif isinstance(f, ast.Name) and f.id in CONVERSIONS and len(node.args) == 1:
            arg = node.args[0]
            bad = isinstance(arg, TENSOR_EXPRESSIONS) and not _counted(arg)
        else:
            continue
        if bad:
            found.append((node.lineno, ast.unparse(node)))
    return found


def test_the_training_path_reads_only_through_read_to_host():
    found = {
        path: hits for path in TRAINING_PATH if (hits := uncounted_reads((ROOT / path).read_text()))
    }
    assert not found, f"reads of device values outside dynemb._host_reads.read_to_host: {found}"


def test_the_lint_finds_each_kind_of_read():
    source = (
        "a = x.item()\nb = x.tolist()\nc = x.cpu()\nd = int(x.sum())\ne = bool((x < 0).any())\n"
        "f = float(x[0])\ng = read_to_host(x, 'why').item()\nh = int(n)\n"
        "i = lookup.value()[0].tolist()\nj = read_to_host(x, 'why').cpu()\n"
    )
    assert [line for line, _ in uncounted_reads(source)] == [1, 2, 3, 4, 5, 6, 10]


def test_a_deferred_read_rides_on_the_next_read_with_its_bits():
    deferred = [
        DeferredRead(torch.tensor([[1, -2], [3, 2**62]]), "test"),
        DeferredRead(torch.tensor([True, False, True]), "test"),
        DeferredRead(torch.tensor(0.1, dtype=torch.float64), "test"),
    ]
    before = host_reads()
    got = read_to_host(torch.arange(5, dtype=torch.int32), "test")
    assert host_reads() - before == 1
    assert torch.equal(got, torch.arange(5, dtype=torch.int32))
    assert all(d.ready for d in deferred)
    assert torch.equal(deferred[0].value(), torch.tensor([[1, -2], [3, 2**62]]))
    assert torch.equal(deferred[1].value(), torch.tensor([True, False, True]))
    assert deferred[2].value().item() == 0.1
    assert host_reads() - before == 1, "the values were read already"
    alone = DeferredRead(torch.tensor([7]), "test")
    assert not alone.ready and alone.value().tolist() == [7]
    assert host_reads() - before == 2, "no read took it: value() reads it"
    copied = copy.deepcopy(DeferredRead(torch.tensor([8]), "test"))  # a copy reads it
    assert copied.ready and copied.value().tolist() == [8]


def test_deferred_status_counts_keep_every_account():
    """A table at its capacity (IGNORE) defers its lookup's status counts; its size,
    last_stats and the module's safe_check_failures read them when asked, and agree
    with the table's contents and with a table that reads them at once (WARNING)."""
    modules = []
    for mode in (dynemb.DynamicEmbCheckMode.IGNORE, dynemb.DynamicEmbCheckMode.WARNING):
        options = DynamicEmbTableOptions(
            dim=4, max_capacity=128, bucket_capacity=128, safe_check_mode=mode, seed=1,
            score_strategy=dynemb.DynamicEmbScoreStrategy.STEP,
        )  # fmt: skip
        modules.append(
            dynemb.BatchedDynamicEmbeddingTables(
                [options],
                [0],
                pooling_mode=DynamicEmbPoolingMode.SUM,
                optimizer=EmbOptimType.EXACT_SGD,
                learning_rate=0.1,
            )  # fmt: skip
        )
    gen = torch.Generator().manual_seed(0)
    for _ in range(3):  # 200 distinct keys a batch, 128 slots, all pinned by the batch
        keys = torch.randperm(1000, generator=gen)[:200]
        offsets = torch.arange(0, 201, 2)
        with pytest.warns(UserWarning, match="could not be stored"):
            for module in reversed(modules):  # IGNORE last: its counts stay unread
                module(keys, offsets).sum().backward()
    ignore, warning = modules
    table = ignore.tables[0]
    before = host_reads()
    assert table.size() == warning.tables[0].size() == 128
    assert host_reads() - before == 1, "reading the size reads the deferred counts once"
    got, want = table.last_stats, warning.tables[0].last_stats
    assert (got.hits, got.inserted, got.evicted, got.failed) == (
        want.hits, want.inserted, want.evicted, want.failed,
    )  # fmt: skip
    assert got.failed == 72
    assert torch.equal(got.failed_keys.sort().values, want.failed_keys.sort().values)
    assert ignore.safe_check_failures == warning.safe_check_failures == [3 * 72]
    assert torch.equal(
        table.export_batch(0, 128)[0].sort().values,
        warning.tables[0].export_batch(0, 128)[0].sort().values,
    )
