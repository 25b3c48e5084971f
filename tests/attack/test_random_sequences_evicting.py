"""Random op sequences on small evicting tables of every evicting score strategy, checked
against the dict-based ReferenceTable after every step (hypothesis; on a failure the
falsifying sequence is printed, and each step is noted as it runs).

A module's table of 32 to 128 slots in buckets of 16 (grown from one bucket, or
allocated whole) meets keys drawn from three times its capacity: a first batch of twice
its capacity fills most buckets, a second one evicts, and so do later batches (up to
48 keys). A batch may
hold more new keys of one bucket than the bucket has slots, where the batch rule
(core/table_ops.h, "Pins": a batch never evicts a key it found or stored) makes the
extra keys fail. ``pytest --hypothesis-show-statistics`` shows how many examples
evicted.

The table's clock is a counter, so TIMESTAMP scores are known: the oracle predicts
every evicting strategy exactly (TIMESTAMP, STEP, CUSTOMIZED, LFU, DECAYED_LFU and the
two compounds). NO_EVICTION is left to tests/table/test_table_oracle.py: it never
evicts, and the oracle does not model its slot placement.

After every step, whatever it was: the table holds exactly the oracle's keys, rows,
scores (and last-access times), never more keys than its capacity, and a lookup of
every key ever used reads its own row or reports it missing. Each op checks more:

- find_or_insert / insert_or_assign / insert_and_evict: the per-key statuses
  (hits, inserted, evicted, failed; the failed keys), the rows a lookup returned, the
  victims (insert_and_evict returns the oracle's: keys, rows, scores, in batch order),
  and that the keys that left the table are exactly those reported evicted;
- find: rows and found flags, nothing changed;
- erase: the count of keys removed;
- dump, then load (later, after other ops): the load restores the table as dumped
  (keys stored since are gone, keys evicted since come back);
- publish: a serving module loaded from the base, which applied every delta as it was
  published, reads each stored key's row and zeros for every other key ever used
  (evicted keys' tombstones);
- incremental_dump: the entries scored (last accessed, for a compound) at or above
  a threshold.
"""

import copy
import itertools
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, event, given, note, settings
from hypothesis import strategies as st

from dynemb import (
    BatchedDynamicEmbeddingTables,
    DynamicEmbDump,
    DynamicEmbInitializerArgs,
    DynamicEmbLoad,
    DynamicEmbPoolingMode,
    DynamicEmbScoreStrategy,
    DynamicEmbTableOptions,
)
from dynemb.deltas import DeltaPublisher, delta_path
from dynemb.incremental_dump import incremental_dump
from dynemb.inference.exportable_tables import InferenceEmbeddingCollection
from tests.support import reference as ref

S = DynamicEmbScoreStrategy
STRATEGIES = {
    "timestamp": (S.TIMESTAMP, ref.TIMESTAMP),
    "step": (S.STEP, ref.STEP),
    "customized": (S.CUSTOMIZED, ref.CUSTOMIZED),
    "lfu": (S.LFU, ref.LFU),
    "decayed_lfu": (S.DECAYED_LFU, ref.DECAYED_LFU),
    "timestamp_lfu": ((S.TIMESTAMP, S.LFU), ref.TIMESTAMP_LFU),
    "timestamp_decayed_lfu": ((S.DECAYED_LFU, S.TIMESTAMP), ref.TIMESTAMP_DECAYED_LFU),
}
DIM, BUCKET, SEED, HALF_LIFE = 4, 16, 5, 3
EDGE = [0, -1, 2**63 - 1, -(2**63)]
UPSERTS = ("find_or_insert", "insert_or_assign", "insert_and_evict")


def _batches(capacity: int, sizes: st.SearchStrategy) -> st.SearchStrategy:
    """Batches of keys drawn from 3 x capacity keys and the edge keys (a batch is
    drawn from a seed, so that its size, not each key, is what hypothesis shrinks)."""

    def keys(size: int, seed: int) -> list[int]:
        picks = np.random.default_rng(seed).integers(0, 3 * capacity + len(EDGE), size)
        return [int(k) if k < 3 * capacity else EDGE[k - 3 * capacity] for k in picks]

    return st.builds(keys, sizes, st.integers(0, 2**32 - 1))


def _assert_rows(keys: list[int], got, want: np.ndarray, what: str) -> None:
    """Row i of ``got`` equals row i of ``want`` (n, DIM) for every i; names the first
    key that differs."""
    got = np.asarray(got, dtype=np.float64).reshape(len(keys), DIM)
    bad = ~np.isclose(got, want, atol=1e-6, rtol=0).all(axis=1)
    assert not bad.any(), f"{what} of key {keys[int(np.argmax(bad))]}"


@st.composite
def scenarios(draw):
    """(capacity, init_capacity, ops): two upserts of 2 x capacity keys (the first
    fills most buckets, the second evicts), then random ops."""
    capacity = draw(st.sampled_from([32, 64, 128]))
    init_capacity = draw(st.sampled_from([BUCKET, capacity]))
    keys = _batches(capacity, st.integers(0, 48))
    seeds = st.integers(0, 2**16)
    fill = st.tuples(st.sampled_from(UPSERTS), _batches(capacity, st.just(2 * capacity)), seeds)
    upsert = st.tuples(st.sampled_from(UPSERTS), keys, seeds)
    other = st.one_of(
        st.tuples(st.just("find"), keys),
        st.tuples(st.just("erase"), keys),
        st.tuples(st.just("dump")),
        st.tuples(st.just("load")),
        st.tuples(st.just("publish")),
        st.tuples(st.just("incremental_dump"), st.integers(0, 2**16)),
    )
    ops = st.lists(upsert | other, min_size=4, max_size=14)  # half of them upserts
    return capacity, init_capacity, [draw(fill), draw(fill), *draw(ops)]


class _Run:
    """The module under test, its oracle, its last dump and its chain of deltas."""

    def __init__(self, directory: Path, strategy: str, capacity: int, init_capacity: int):
        score_strategy, self.code = STRATEGIES[strategy]
        half_life = HALF_LIFE if self.code in ref.DECAYED else None
        self.options = DynamicEmbTableOptions(
            dim=DIM, max_capacity=capacity, init_capacity=init_capacity, bucket_capacity=BUCKET,
            score_strategy=score_strategy, score_half_life_steps=half_life,
            initializer_args=DynamicEmbInitializerArgs(lower=-0.1, upper=0.1), seed=SEED,
        )  # fmt: skip
        self.module = BatchedDynamicEmbeddingTables(
            [self.options], [0], pooling_mode=DynamicEmbPoolingMode.NONE, table_names=["t"]
        )
        self.oracle = ref.ReferenceTable(
            DIM, capacity, init_capacity, BUCKET, self.code, seed=SEED, init=(2, -0.1, 0.1),
            half_life=half_life,
        )  # fmt: skip
        clock = itertools.count(1000, 7)
        self.last_time = None

        def tick():  # TIMESTAMP scores: a counter, read once per batch
            self.last_time = next(clock)
            return self.last_time

        self.table.state.clock = tick
        self.directory = directory
        self.publisher = DeltaPublisher(self.module, directory / "chain")
        self.publisher.publish_base()
        # The server: the base, then each delta as it is published.
        self.serving = InferenceEmbeddingCollection([self.options], table_names=["t"])
        self.serving.load_from_dynamicemb_file(self.publisher.base_path)
        self.dumps = 0
        self.saved = None  # (path, the oracle as dumped)
        self.seen = set(EDGE)
        self.stored = set()  # the table's keys after the previous step
        self.evictions = 0  # victims over the sequence

    @property
    def table(self):
        return self.module.tables[0]

    def apply(self, op) -> None:
        kind, args = op[0], op[1:]
        if kind in UPSERTS:
            self.upsert(kind, *args)
        elif kind == "find":
            self.seen.update(args[0])
            self.check_lookup(args[0])
        elif kind == "erase":
            self.seen.update(args[0])
            keys = torch.tensor(args[0], dtype=torch.int64)
            assert self.table.erase(keys) == self.oracle.erase(args[0]), "erased count"
        elif kind == "dump":
            self.dumps += 1
            path = self.directory / f"ckpt-{self.dumps}"
            DynamicEmbDump(path, self.module)
            self.saved = (path, copy.deepcopy(self.oracle))
        elif kind == "load":  # the last dump (a round trip when there is none yet)
            if self.saved is None:
                self.apply(("dump",))
            self.load(*self.saved)
        elif kind == "publish":
            self.publish()
        else:
            self.check_incremental_dump(args[0])
        self.check_table()

    def upsert(self, kind, batch, seed) -> None:
        self.seen.update(batch)
        gen = torch.Generator().manual_seed(seed)
        keys = torch.tensor(batch, dtype=torch.int64)
        scores = None
        if self.code == ref.CUSTOMIZED:
            scores = torch.randint(0, 40, (keys.numel(),), generator=gen)
        values = torch.randn(keys.numel(), DIM, generator=gen)
        reported = None
        if kind == "find_or_insert":
            rows = self.table.find_or_insert(keys, scores)
            values = None
        elif kind == "insert_or_assign":
            self.table.insert_or_assign(keys, values, scores)
        else:
            reported = self.table.insert_and_evict(keys, values, scores)
        status, evicted = self.oracle.upsert(
            batch, scores, None if values is None else values.numpy(), self.last_time
        )
        got = self.table.last_stats
        assert [got.hits, got.inserted, got.evicted, got.failed] == [
            status.count(s) for s in range(4)
        ], "status counts (hits, inserted, evicted, failed)"
        failed = [k for k, s in zip(batch, status) if s == ref.FAILED]
        assert got.failed_keys.tolist() == failed, "failed keys"
        if kind == "find_or_insert":
            # a failed key reads its initial row, unstored
            want = np.array([row[:DIM] for row in self.oracle.rows]).reshape(-1, DIM)
            _assert_rows(batch, rows, want, "returned row")
        victims = [evicted[i] for i in sorted(evicted)]
        if reported is not None:
            ek, ev, es = reported
            assert ek.tolist() == [v[0] for v in victims], "evicted keys"
            assert es.tolist() == [v[2] for v in victims], "evicted scores"
            want = np.array([v[1][:DIM] for v in victims]).reshape(-1, DIM)
            _assert_rows([v[0] for v in victims], ev[:, :DIM], want, "evicted row")
        after = set(self.stored_entries()[0])
        left = self.stored - after
        assert left == {v[0] for v in victims}, "the keys that left are not the evicted ones"
        assert got.evicted == len(left), "evictions reported"
        self.evictions += len(left)

    def load(self, path: Path, dumped: ref.ReferenceTable) -> None:
        """Restores the dump; the oracle becomes the dumped one, in the table's buckets
        now (a table keeps the buckets it grew to; each is a half of a dumped one)."""
        DynamicEmbLoad(path, self.module, strict=True)
        self.oracle = copy.deepcopy(dumped)
        self.oracle.nb = self.table.num_buckets
        self.oracle.buckets = {}
        for k in self.oracle.entries:
            self.oracle.buckets.setdefault(ref.bucket_of(k, self.oracle.nb), set()).add(k)

    def stored_entries(self) -> tuple[list[int], torch.Tensor, list[int]]:
        """(keys, rows, scores) of every stored entry, from a slot scan."""
        keys, rows, scores, _ = self.table.export_batch(0, self.table.capacity())
        return keys.tolist(), rows, scores.tolist()

    def oracle_rows(self, keys: list[int]) -> np.ndarray:
        """(n, DIM): the oracle's row of each key, zeros where it holds none."""
        rows = np.zeros((len(keys), DIM), np.float32)
        for i, key in enumerate(keys):
            row = self.oracle.find(key)
            if row is not None:
                rows[i] = row[:DIM]
        return rows

    def check_lookup(self, keys: list[int]) -> None:
        """A lookup reads each stored key's own row and reports the others missing."""
        values, found = self.table.find(torch.tensor(keys, dtype=torch.int64))
        want = [k in self.oracle.entries for k in keys]
        assert found.tolist() == want, "found flags"
        _assert_rows(keys, values, self.oracle_rows(keys), "looked-up row")

    def check_table(self) -> None:
        keys, rows, scores = self.stored_entries()
        assert sorted(keys) == sorted(self.oracle.entries), "stored keys"
        assert self.table.size() == len(keys) <= self.table.capacity(), "size"
        assert self.table.capacity() == self.oracle.capacity(), "grown capacity"
        _assert_rows(keys, rows, self.oracle_rows(keys), "stored row")
        assert scores == [self.oracle.entries[k][1] for k in keys], "scores"
        if self.code in ref.STAMPED and keys:
            stamps = self.table.get_timestamps(torch.tensor(keys, dtype=torch.int64))
            assert stamps.tolist() == [self.oracle.entries[k][2] for k in keys], "timestamps"
        self.check_lookup(sorted(self.seen))
        self.stored = set(keys)

    def publish(self) -> None:
        """Publishes a delta; the server applies it and serves the oracle's rows."""
        version = self.publisher.publish()
        self.serving.apply_delta(delta_path(self.publisher.directory, version))
        assert self.serving.sizes == [len(self.oracle.entries)], "served size"
        seen = sorted(self.seen)
        rows = self.serving(torch.tensor(seen), torch.arange(len(seen) + 1))
        _assert_rows(seen, rows, self.oracle_rows(seen), "served row")

    def check_incremental_dump(self, pick: int) -> None:
        """Threshold: one of the stored filter values (or one above them all)."""
        column = 2 if self.code in ref.STAMPED else 1  # the compounds filter by time
        values = sorted({e[column] for e in self.oracle.entries.values()})
        values.append(values[-1] + 1 if values else 0)
        threshold = values[pick % len(values)]
        dumped, _ = incremental_dump(self.module, threshold)
        keys, rows = dumped["model"]["t"]
        want = [k for k, e in self.oracle.entries.items() if e[column] >= threshold]
        assert sorted(keys.tolist()) == sorted(want), f"incremental dump at {threshold}"
        _assert_rows(keys.tolist(), rows, self.oracle_rows(keys.tolist()), "dumped row")


@pytest.mark.parametrize("strategy", list(STRATEGIES))
@settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(scenario=scenarios())
def test_evicting_sequences_match_the_reference_table(strategy, scenario):
    capacity, init_capacity, sequence = scenario
    with tempfile.TemporaryDirectory() as directory:
        run = _Run(Path(directory), strategy, capacity, init_capacity)
        note(f"{strategy}: capacity {capacity}, from {init_capacity}")
        try:
            for step, op in enumerate(sequence):
                note(f"step {step}: {op!r}")
                run.apply(op)
            run.publish()
        finally:
            run.publisher.close()  # its writer threads end with it, whatever failed
        event(f"evicted: {run.evictions > 0}")
