"""The table oracle's harness: a ScoredHashTable driven beside the dict-based reference
(tests/support/reference.py), its strategies by name, and the keys every run includes."""

import itertools

import numpy as np
import torch

import dynemb
from dynemb import DynamicEmbInitializerArgs, DynamicEmbInitializerMode, DynamicEmbScoreStrategy
from tests.support import reference as ref

S = DynamicEmbScoreStrategy


STRATEGIES = {
    "timestamp": (S.TIMESTAMP, ref.TIMESTAMP),
    "step": (S.STEP, ref.STEP),
    "customized": (S.CUSTOMIZED, ref.CUSTOMIZED),
    "lfu": (S.LFU, ref.LFU),
    "no_eviction": (S.NO_EVICTION, ref.NO_EVICTION),
    "timestamp_lfu": ((S.TIMESTAMP, S.LFU), ref.TIMESTAMP_LFU),
    "decayed_lfu": (S.DECAYED_LFU, ref.DECAYED_LFU),
    "timestamp_decayed_lfu": ((S.DECAYED_LFU, S.TIMESTAMP), ref.TIMESTAMP_DECAYED_LFU),
}


HALF_LIFE = 3  # steps: the decayed strategies' scores change much over 40 ops


EDGE_KEYS = [0, -1, 1, 2**63 - 1, -(2**63)]


class Harness:
    def __init__(
        self,
        strategy_name,
        dim=4,
        extra=2,
        capacity=256,
        init_capacity=32,
        bc=16,
        debug_init=False,
        seed=3,
        **tiers,
    ):
        strategy, code = STRATEGIES[strategy_name]
        half_life = HALF_LIFE if code in ref.DECAYED else None
        init = (
            DynamicEmbInitializerArgs(mode=DynamicEmbInitializerMode.DEBUG)
            if debug_init
            else DynamicEmbInitializerArgs(lower=-0.1, upper=0.1)
        )
        self.table = dynemb.ScoredHashTable(
            dim=dim, capacity=capacity, init_capacity=init_capacity, bucket_capacity=bc,
            score_strategy=strategy, extra_columns=extra, initializer=init, seed=seed,
            extra_init=0.5, score_half_life_steps=half_life, **tiers,
        )  # fmt: skip
        self.clock = itertools.count(1000, 7)
        self.last_time = None

        def tick():
            self.last_time = next(self.clock)
            return self.last_time

        self.table.state.clock = tick
        mode = (4, 0.0, 0.0) if debug_init else (2, -0.1, 0.1)
        self.oracle = ref.ReferenceTable(
            dim, capacity, init_capacity, bc, code, extra_columns=extra, seed=seed, init=mode,
            extra_init=0.5, half_life=half_life,
        )  # fmt: skip
        self.code = code
        self.seen = set(EDGE_KEYS)

    def _scores(self, rng, n):
        if self.code != ref.CUSTOMIZED:
            return None
        return torch.from_numpy(rng.integers(0, 40, n)).to(torch.int64)

    def _check_status(self, keys, status):
        """Compares per-key statuses; under NO_EVICTION reconciles legitimate failures."""
        got = self.table.last_stats
        if self.code == ref.NO_EVICTION:
            for k in got.failed_keys.tolist():
                assert self.table.capacity() == self.table.max_capacity(), (
                    "failed below max capacity"
                )
                assert ref.window_full(self.table, k), f"key {k} failed with room in its window"
                self.oracle.drop(k)
            return
        want = [status.count(s) for s in range(4)]
        assert [got.hits, got.inserted, got.evicted, got.failed] == want
        failed = [int(k) for k, s in zip(keys.tolist(), status) if s == ref.FAILED]
        assert got.failed_keys.tolist() == failed

    def find_or_insert(self, keys, rng):
        scores = self._scores(rng, keys.numel())
        rows = self.table.find_or_insert(keys, scores)
        status, _ = self.oracle.upsert(keys.tolist(), scores, batch_value=self.last_time)
        self._check_status(keys, status)
        for i, k in enumerate(keys.tolist()):
            want = self.oracle.rows[i]  # failed keys see their initial row, unstored
            assert ref.isclose_rows(rows[i], want[: self.table.dim]), f"row of key {k}"

    def insert(self, keys, rng, evict):
        scores = self._scores(rng, keys.numel())
        width = self.table.dim + (self.table.extra_columns if rng.random() < 0.5 else 0)
        values = torch.from_numpy(rng.standard_normal((keys.numel(), width)).astype(np.float32))
        if evict:
            ek, ev, es = self.table.insert_and_evict(keys, values, scores)
        else:
            self.table.insert_or_assign(keys, values, scores)
        status, evicted = self.oracle.upsert(keys.tolist(), scores, values.numpy(), self.last_time)
        self._check_status(keys, status)
        if evict and self.code != ref.NO_EVICTION:
            want = [evicted[i] for i in sorted(evicted)]
            assert ek.tolist() == [w[0] for w in want]
            assert es.tolist() == [w[2] for w in want]
            for row, w in zip(ev, want):
                assert ref.isclose_rows(row, w[1])

    def erase(self, keys):
        assert self.table.erase(keys) == self.oracle.erase(keys.tolist())

    def check_all(self):
        t, o = self.table, self.oracle
        assert t.size() == len(o.entries)
        keys = torch.tensor(sorted(self.seen), dtype=torch.int64)
        values, found = t.find(keys)
        scores = t.get_scores(keys)
        for i, k in enumerate(keys.tolist()):
            e = o.entries.get(k)
            assert bool(found[i]) == (e is not None), f"found flag of key {k}"
            if e is None:
                assert int(scores[i]) == 0
                continue
            assert ref.isclose_rows(values[i], e[0][: t.dim]), f"value of key {k}"
            if self.code != ref.NO_EVICTION:
                assert int(scores[i]) == e[1], f"score of key {k}"
        if self.code in ref.STAMPED:
            stamps = t.get_timestamps(keys)
            for i, k in enumerate(keys.tolist()):
                if k in o.entries:
                    assert int(stamps[i]) == o.entries[k][2]

    def check_export(self):
        got = {}
        offset = 0
        while offset < self.table.capacity():
            k, v, s, offset = self.table.export_batch(offset, 37, include_extra=True)
            for key, row, score in zip(k.tolist(), v, s.tolist()):
                assert key not in got, f"key {key} exported twice"
                got[key] = (row.numpy(), score)
        assert set(got) == set(self.oracle.entries)
        for key, (row, score) in got.items():
            e = self.oracle.entries[key]
            assert ref.isclose_rows(row, e[0])
            if self.code != ref.NO_EVICTION:
                assert score == e[1]
