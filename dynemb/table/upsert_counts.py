"""``TableTelemetry``: what a table's batch upserts did, counted as they happen.

Every batch upsert of a table (a training lookup, ``find_or_insert``,
``insert_or_assign``, a checkpoint load, a cache's write-back) is one *step* of its
telemetry. Its counts (hits, inserted, evicted, failed) are the op's status counts,
which the host reads anyway (growth.py decides on them), so counting costs a few
integer additions and no device read.

Evicted keys are looked at on sampled steps only (``sample_every``): before the op
the table's score column (and its last-access column, for the (TIMESTAMP, ...)
compounds) and occupancy are copied; after it, each evicted resident's old score is
read at the slot its successor took (the pin rule keeps that successor in place for
the batch), and compared with the scores stored at the start of the step. All of it
stays on the table's device: nothing is read back until a report asks
(``evictions()``, telemetry_reports.py). A step on which the table grew is not
sampled (its slots moved).

Concurrency: ``before_upsert`` / ``after_upsert`` run under the table's
``lock.write()`` (growth.py); the reports take ``lock.read()``.
"""

import collections
import copy
import dataclasses
import weakref

import torch

from dynemb import _ops
from dynemb.config.types import DynamicEmbScoreStrategy
from dynemb.table.batch_arguments import TIMESTAMP_CODES
from dynemb.table.telemetry_reports import (
    BucketFill,
    EvictionSummary,
    bucket_fill,
    eviction_ranks,
    summarize_evictions,
)

# What an evicted resident's age is measured from, per strategy code: its score
# ("score": TIMESTAMP and STEP scores are the batch value of the last access), its
# last-access column ("timestamps": the compounds), or nothing (LFU, DECAYED_LFU,
# CUSTOMIZED: the score is a count or the user's; only the score is reported).
_AGE_SOURCE = {
    DynamicEmbScoreStrategy.TIMESTAMP.value: "score",
    DynamicEmbScoreStrategy.STEP.value: "score",
    **{code: "timestamps" for code in TIMESTAMP_CODES},
}
# Stored scores an eviction's rank is measured against (a stride through the slots): a
# rank p is then estimated within about sqrt(p (1 - p) / 4096), 0.0016 at p = 0.01.
RANK_REFERENCE_SLOTS = 1 << 12


@dataclasses.dataclass(frozen=True)
class StepCounts:
    """One batch upsert of a table (distinct keys of a training lookup).

    Attributes:
        step: the table's step counter at that upsert (``ScoredHashTable.score_step``).
        hits / inserted / evicted / failed: keys found; stored in a free slot; stored
            in place of an evicted resident; not stored.
        size / capacity: stored keys and allocated slots after the upsert.
    """

    step: int
    hits: int
    inserted: int
    evicted: int
    failed: int
    size: int
    capacity: int

    @property
    def load_factor(self) -> float:
        return self.size / self.capacity if self.capacity else 0.0


@dataclasses.dataclass
class _Sample:
    """A sampled step's copy of the table before its op."""

    generation: int
    batch_value: int
    pinned: bool  # the batch's keys are pinned: each stays in the slot it took
    scores: torch.Tensor  # (slots,) int64
    last_access: torch.Tensor | None  # (slots,) int64: scores or timestamps; None: no age
    reference: torch.Tensor  # (r,) int64 sorted: stored scores of a strided slot sample
    stored: torch.Tensor  # () int64: how many of the reference slots held a key


class TableTelemetry:
    """Counters of one table's batch upserts: totals since creation (or ``reset``), the
    last ``window`` steps, and on sampled steps its evicted keys' ages and scores.

    Args:
        state: the table's TableState (read for sizes, buffers and the strategy).
        window: steps kept in ``recent`` (>= 1).
        sample_every: every this many steps, the evicted residents are recorded (0:
            never).
        max_samples: evicted residents kept for ``evictions()`` (the latest ones).

    Attributes:
        enabled: False stops all counting (the table then runs as without telemetry).
        steps / hits / inserted / evicted / failed: totals.
        rule_passes / rule_buckets / rule_erased: eviction by rule (an
            ``EvictionRule``): passes started, buckets scanned, keys erased; totals.
        recent: the last ``window`` StepCounts, oldest first.
    """

    def __init__(self, state, window: int = 100, sample_every: int = 100,
                 max_samples: int = 1 << 16) -> None:  # fmt: skip
        # A weak reference: the state owns its telemetry, and a cycle would keep a
        # deleted table (its spill directory, its memory) alive until a collection.
        self._state_ref = weakref.ref(state)
        self.enabled = True
        self.configure(window=window, sample_every=sample_every, max_samples=max_samples)
        self.reset()

    @property
    def _state(self):
        state = self._state_ref()
        if state is None:
            raise RuntimeError("TableTelemetry: its table was deleted")
        return state

    def __deepcopy__(self, memo: dict) -> "TableTelemetry":
        """A copy of a table's state gets telemetry of the copy (``copy.deepcopy`` has
        put the copied state in ``memo`` before its fields)."""
        state = self._state_ref()
        other = copy.copy(self)
        for name, value in vars(self).items():
            if name != "_state_ref":
                setattr(other, name, copy.deepcopy(value, memo))
        vars(other)["_state_ref"] = weakref.ref(memo.get(id(state), state))
        return other

    def configure(self, window: int | None = None, sample_every: int | None = None,
                  max_samples: int | None = None, enabled: bool | None = None) -> None:  # fmt: skip
        """Changes the settings given (None: kept); checked before any changes.

        Raises:
            ValueError / TypeError: ``window`` or ``max_samples`` below 1,
                ``sample_every`` below 0, ``enabled`` not a bool.
        """
        for name, value, low in (("window", window, 1), ("sample_every", sample_every, 0),
                                 ("max_samples", max_samples, 1)):  # fmt: skip
            if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
                raise TypeError(f"TableTelemetry.{name} must be an int, got {value!r}")
            if value is not None and value < low:
                raise ValueError(f"TableTelemetry.{name} must be >= {low}, got {value}")
        if enabled is not None and not isinstance(enabled, bool):
            raise TypeError(f"TableTelemetry.enabled must be a bool, got {enabled!r}")
        if window is not None:
            self.window = window
            self.recent = collections.deque(getattr(self, "recent", ()), maxlen=window)
        if sample_every is not None:
            self.sample_every = sample_every
        if max_samples is not None:
            self.max_samples = max_samples
        if enabled is not None:
            self.enabled = enabled

    def reset(self) -> None:
        """Forgets every count and sample (the settings stay)."""
        self.steps = self.hits = self.inserted = self.evicted = self.failed = 0
        # Eviction by rule (dynemb.eviction_rules): passes started, buckets scanned, keys erased.
        self.rule_passes = self.rule_buckets = self.rule_erased = 0
        self.recent = collections.deque(maxlen=self.window)
        self.sampled_steps = 0
        self._evictions: list[tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]] = []
        self._kept = 0
        self._sample: _Sample | None = None

    # ------------------------------------------------------------------ reports

    @property
    def last(self) -> StepCounts | None:
        """The latest step's counts (None before any)."""
        return self.recent[-1] if self.recent else None

    def load_factor(self) -> float:
        """Stored keys / allocated slots, now."""
        capacity = self._state.storage.num_slots
        return self._state.size / capacity if capacity else 0.0

    def window_totals(self) -> StepCounts:
        """The counts of the ``recent`` steps added up (step, size, capacity: the last's)."""
        last = self.last
        sums = [sum(getattr(s, f) for s in self.recent)
                for f in ("hits", "inserted", "evicted", "failed")]  # fmt: skip
        if last is None:
            return StepCounts(0, 0, 0, 0, 0, self._state.size, self._state.storage.num_slots)
        return StepCounts(last.step, *sums, last.size, last.capacity)

    @property
    def age_unit(self) -> str | None:
        """The unit of evicted ages: "steps" (STEP), "seconds" (TIMESTAMP and the
        compounds) or None (LFU, DECAYED_LFU, CUSTOMIZED: no last access is kept)."""
        source = _AGE_SOURCE.get(self._state.strategy)
        if source is None:
            return None
        return "steps" if _ops.BATCH_VALUE_SOURCES[self._state.strategy] == "step" else "seconds"

    def evictions(self) -> EvictionSummary:
        """Ages, scores and ranks of the evicted residents of the sampled steps (on
        demand: reads the samples back once). See telemetry_reports.EvictionSummary."""

        with self._state.lock.read():  # the training thread appends samples under write()
            samples = list(self._evictions)

        def joined(i: int, dtype: torch.dtype) -> torch.Tensor:
            parts = [p[i] for p in samples]
            return torch.cat(parts).cpu() if parts else torch.empty(0, dtype=dtype)

        scores, ranks, unit = joined(0, torch.int64), joined(2, torch.float64), self.age_unit
        ages = None
        if unit is not None:
            ages = joined(1, torch.int64).double() * (1e-9 if unit == "seconds" else 1.0)
        return summarize_evictions(scores, ages, unit, ranks, self.sampled_steps)

    def bucket_fill(self) -> BucketFill:
        """Occupancy of every bucket now (on demand: one pass over the digests)."""
        with self._state.lock.read():
            return bucket_fill(self._state.storage.digests)

    # ------------------------------------------- hooks of growth.py (lock.write())

    def before_upsert(self, batch_value: int, pinned: bool = True) -> None:
        """A batch upsert starts (``state.step`` already counts it; ``pinned``: its keys
        are pinned): on a sampled step of an evicting table, copies what
        ``after_upsert`` compares evictions with."""
        self._sample = None
        st = self._state
        if not (self.enabled and self.sample_every and st.layout.keeps_scores):
            return
        if st.step % self.sample_every or st.num_buckets < st.max_buckets:
            return  # below max_buckets a full bucket grows the table: nothing is evicted
        s = st.storage
        source = _AGE_SOURCE.get(st.strategy)
        scores = s.scores.view(-1).clone()
        last = scores if source == "score" else None
        if source == "timestamps":
            last = s.timestamps.view(-1).clone()
        stride = max(1, -(-scores.numel() // RANK_REFERENCE_SLOTS))
        occupied = s.digests.view(-1)[::stride] != 0
        reference = torch.where(occupied, scores[::stride], _ops.MAX_SCORE).sort().values
        self._sample = _Sample(
            st.generation, batch_value, pinned, scores, last, reference, occupied.sum()
        )

    def after_upsert(self, status: torch.Tensor, keys: torch.Tensor, counts: list,
                     slots: torch.Tensor | None = None) -> None:  # fmt: skip
        """The op (and any growth) is done: counts the step and, on a sampled step,
        records its evicted residents. ``counts``: hits, inserted, evicted, failed;
        ``slots``: the keys' slots when the op gave them (else they are probed)."""
        if not self.enabled:
            return
        st = self._state
        self.count(counts, st.step, st.size)
        evicted = counts[2]
        sample, self._sample = self._sample, None
        if sample is None or sample.generation != st.generation:
            return
        self.sampled_steps += 1
        if evicted:
            self._record(sample, status, keys, evicted, slots)

    def count(self, counts: list, step: int, size: int) -> None:
        """Counts one batch upsert of table step ``step`` (``counts``: hits, inserted,
        evicted, failed; ``size``: stored keys after it). A lookup whose status counts
        were read later (growth.py, DeferredLookup) is counted when they are folded."""
        if not self.enabled:
            return
        hits, inserted, evicted, failed = counts
        self.steps += 1
        self.hits += hits
        self.inserted += inserted
        self.evicted += evicted
        self.failed += failed
        self.recent.append(StepCounts(step, hits, inserted, evicted, failed, size,
                                      self._state.storage.num_slots))  # fmt: skip

    @property
    def sampling(self) -> bool:
        """Whether the batch upsert under way is a sampled one (its status is needed
        now: its lookup's counts are not deferred)."""
        return self._sample is not None

    def _record(self, sample: _Sample, status, keys, evicted: int, slots) -> None:
        at = torch.nonzero_static(status == _ops.Status.EVICTED, size=evicted).view(-1)
        if slots is not None and slots.numel() == keys.numel():
            slots = slots[at]  # where each successor is: the evicted resident's slot
        else:
            slots = _ops.table_find_slots(self._state.storage.tensors(), keys[at].contiguous())
        if not sample.pinned:  # a restore: a later key of the batch may have evicted it
            slots = slots[slots >= 0]
        scores = sample.scores[slots]
        ages = None
        if sample.last_access is not None:
            ages = sample.batch_value - sample.last_access[slots]
        ranks = eviction_ranks(scores, sample.reference, sample.stored)
        self._evictions.append((scores, ages, ranks))
        self._kept += scores.numel()
        while self._kept - self._evictions[0][0].numel() >= self.max_samples:
            self._kept -= self._evictions.pop(0)[0].numel()


__all__ = ["StepCounts", "TableTelemetry"]
