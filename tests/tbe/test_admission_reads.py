"""Admission without reads of the device: ``KVCounter.add_distinct`` counts as ``add``
does, and a module whose admitted lookups and counter stores read their status
counts later trains the same tables, counters, outputs and failure counts as the
eager path (``add``, the checked lookup, counts read at once), step by step."""

import types
import warnings

import pytest
import torch

import dynemb
from dynemb import _ops
from dynemb._executor import executor
from dynemb._host_reads import host_reads
from dynemb.admission_strategies import FrequencyAdmissionStrategy, KVCounter
from dynemb.optimizer import EmbOptimType


def _dump(counter: KVCounter) -> dict:
    keys, counts = counter.dump()
    return dict(zip(keys.tolist(), counts.tolist(), strict=True))


def test_add_distinct_counts_as_add_without_reading_the_device():
    """Counts, forgetting in full buckets and saturation at MAX_SCORE agree with
    ``add``; ``add_distinct`` reads nothing, and ``size`` reads the deferred counts."""
    eager, deferred = KVCounter(capacity=32, bucket_capacity=16), KVCounter(32, 16)
    gen = torch.Generator().manual_seed(5)
    for step in range(8):  # 40 keys a call into 32 slots: full buckets forget keys
        keys = torch.randperm(200, generator=gen)[:40]
        freq = torch.randint(0, 4, (40,), generator=gen)
        if step == 5:
            freq[:3] = _ops.MAX_SCORE - 1  # saturates on the next sight
        before = host_reads()
        got = deferred.add_distinct(keys, freq)
        assert host_reads() == before, "add_distinct read the device"
        assert torch.equal(got, eager.add(keys, freq))
    assert _dump(deferred) == _dump(eager)
    assert max(_dump(eager).values()) == _ops.MAX_SCORE
    assert deferred.size() == eager.size() == len(_dump(eager)) == 32
    assert deferred.add_distinct(torch.zeros(0, dtype=torch.int64), torch.zeros(0)).numel() == 0


def _module(mode):
    options = dynemb.DynamicEmbTableOptions(
        dim=4, max_capacity=128, bucket_capacity=128, safe_check_mode=mode, seed=2,
        score_strategy=dynemb.DynamicEmbScoreStrategy.LFU,
        initializer_args=dynemb.DynamicEmbInitializerArgs(
            mode=dynemb.DynamicEmbInitializerMode.UNIFORM, lower=-1.0, upper=1.0
        ),
        admit_strategy=FrequencyAdmissionStrategy(2, counter=KVCounter(capacity=64, bucket_capacity=16)),
    )  # fmt: skip
    return dynemb.BatchedDynamicEmbeddingTables(
        [options], [0], pooling_mode=dynemb.DynamicEmbPoolingMode.SUM,
        optimizer=EmbOptimType.EXACT_ROWWISE_ADAGRAD, learning_rate=0.1,
    )  # fmt: skip


def _eager(module):
    """The module's admission as it was before deferral: ``add`` (checked, its own
    distinct count), ``insert_or_assign`` (scores checked, counts read) and the
    checked lookup of the admitted keys (counts read at once)."""
    counter = module.admission_counters[0]
    counter.add_distinct = counter.add

    def store(self, keys, counts):
        values = torch.zeros((keys.numel(), 1), dtype=torch.float16, device=self.device)
        self._table.insert_or_assign(keys, values, scores=counts)

    counter._store = types.MethodType(store, counter)
    module._lookups._admitted_lookup = module._lookups._checked_lookup
    return module


def _table(module) -> tuple:
    table = module.tables[0]
    keys, rows, scores, _ = table.export_batch(0, table.capacity(), include_extra=True)
    order = keys.argsort()
    return keys[order], rows[order], scores[order]


@pytest.mark.parametrize("mode", ["IGNORE", "WARNING"])
def test_deferred_admission_trains_as_the_eager_path(mode):
    """128 slots, ~150 distinct keys a batch from 400, a counter of 64: keys are
    counted, forgotten, admitted, evicted and (IGNORE, WARNING) not stored."""
    mode = getattr(dynemb.DynamicEmbCheckMode, mode)
    deferred, eager = _module(mode), _eager(_module(mode))
    gen = torch.Generator().manual_seed(1)
    for _ in range(6):
        keys = torch.randint(0, 400, (300,), generator=gen)
        offsets = torch.arange(0, 301, 3)
        outs, reads = [], []
        for module in (deferred, eager):
            before = host_reads()
            with warnings.catch_warnings():  # WARNING's: not what this test compares
                warnings.simplefilter("ignore")
                out = module(keys, offsets)
                (out * torch.linspace(-1, 1, 4)).sum().backward()
            reads.append(host_reads() - before)
            outs.append(out.detach())
        assert reads[0] < reads[1], reads  # WARNING reads the lookup's counts at once
        if mode == dynemb.DynamicEmbCheckMode.IGNORE:  # the layout (+ distinct count) only
            assert reads[0] <= (2 if executor() == "cuda-emulated" else 1)
        assert torch.equal(outs[0], outs[1])
        for got, want in zip(_table(deferred), _table(eager), strict=True):
            assert torch.equal(got, want)
    table, want = deferred.tables[0], eager.tables[0]
    assert table.size() == want.size() == _table(eager)[0].numel() == 128
    got_stats, want_stats = table.last_stats, want.last_stats
    fields = ("hits", "inserted", "evicted", "failed")
    assert [getattr(got_stats, f) for f in fields] == [getattr(want_stats, f) for f in fields]
    assert torch.equal(got_stats.failed_keys.sort().values, want_stats.failed_keys.sort().values)
    assert deferred.safe_check_failures == eager.safe_check_failures
    assert eager.safe_check_failures[0] > 0, "the case: admitted keys a full table cannot store"
    counters = deferred.admission_counters[0], eager.admission_counters[0]
    assert _dump(counters[0]) == _dump(counters[1]) and counters[0].size() == counters[1].size()
