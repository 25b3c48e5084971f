"""Pure-Python oracles: the key hash, the initializer and a dict-based scored table.

ReferenceTable applies the rules of csrc/core/table_ops.h to Python dicts, one key
at a time in batch order: home bucket by the same hash, the (score, digest, key) minimum
evicted from a full bucket, CUSTOMIZED refusals, growth (2x buckets; under NO_EVICTION
to a load of 0.74, by 5/4 to 13/10) while below max capacity with failed keys retried
in batch order. Under NO_EVICTION the choice between a key's home and second bucket
depends on the fills as a batch starts, an executor detail, so the oracle does not
model it: it checks instead that a key the table reports as failed really had both
buckets full.
"""

import numpy as np

from dynemb.table.capacity import bucket_counts, next_bucket_count
from tests.support import decay_reference as decay

M64 = (1 << 64) - 1
M32 = (1 << 32) - 1
MAX_PROBE_BUCKETS = 2  # a NO_EVICTION key's home and second bucket
SECOND_BUCKET_SPAN = 16
HIT, INSERTED, EVICTED, FAILED = range(4)
TIMESTAMP, STEP, CUSTOMIZED, LFU, NO_EVICTION, TIMESTAMP_LFU = range(6)
# A cache tier's own score (internal, core/score_policy.h ScoreStrategy::kCache): the
# batches that used the key since it entered, << 32, | the latest one's number.
CACHE = 6
CACHE_BATCH_MASK, CACHE_MAX_USES = 0xFFFFFFFF, 0x7FFFFFFF
MAX_SCORE = 2**63 - 1  # LFU counts saturate here (core/score_policy.h kMaxScore)
# Decayed counts (core/decay.h; tests/support/decay_reference.py) and their compound.
DECAYED_LFU, TIMESTAMP_DECAYED_LFU = 7, 8
DECAYED = (DECAYED_LFU, TIMESTAMP_DECAYED_LFU)
STAMPED = (TIMESTAMP_LFU, TIMESTAMP_DECAYED_LFU)  # a last-access time beside the score


def mix64(k: int) -> int:
    k &= M64
    k ^= k >> 33
    k = (k * 0xFF51AFD7ED558CCD) & M64
    k ^= k >> 33
    k = (k * 0xC4CEB9FE1A85EC53) & M64
    k ^= k >> 33
    return k


def hash_key(key: int) -> int:
    return mix64(key & M64)


def bucket_of(key: int, num_buckets: int) -> int:
    return ((hash_key(key) >> 32) * num_buckets) >> 32


def second_bucket_of(key: int, num_buckets: int) -> int:
    """core/hash.h second_bucket_of: one of the SECOND_BUCKET_SPAN buckets after home."""
    h2 = mix64(hash_key(key) ^ 0x9E3779B97F4A7C15) >> 32
    span = min(num_buckets - 1, SECOND_BUCKET_SPAN)
    return (bucket_of(key, num_buckets) + 1 + ((h2 * span) >> 32)) % num_buckets


def digest_of(key: int) -> int:
    d = hash_key(key) & 0xFF
    return d if d else 1


def _draw32(stream: int, c: int) -> int:
    """core/initializer.h draw32: fmix32 of the counter, the stream's high word added
    between its multiplies."""
    x = ((stream & M32) + (c + 1) * 0x9E3779B9) & M32
    x ^= x >> 16
    x = (x * 0x85EBCA6B) & M32
    x ^= x >> 13
    x = (x + (stream >> 32)) & M32
    x = (x * 0xC2B2AE35) & M32
    x ^= x >> 16
    return x


def init_row(
    key: int, seed: int, mode: int, a: float, b: float, dim: int, row_width: int, extra: float
):
    """Reference of core/initializer.h for UNIFORM (2), CONSTANT (3) and DEBUG (4)."""
    stream = mix64((key & M64) ^ mix64((seed & M64) ^ 0x5851F42D4C957F2D))
    row = np.full(row_width, extra, dtype=np.float32)
    if mode == 2:
        for j in range(dim):
            u = np.float32((_draw32(stream, j) >> 8) * 2.0**-24)
            row[j] = np.float32(a) + (np.float32(b) - np.float32(a)) * u
    elif mode == 3:
        row[:dim] = a
    elif mode == 4:
        row[:dim] = np.float32(float((key & M64) % 100000))  # DynamicEmb's DEBUG
    else:
        raise NotImplementedError(mode)
    return row


class ReferenceTable:
    """Dict-based oracle of ScoredHashTable with the same eviction rule."""

    def __init__(
        self,
        dim,
        capacity,
        init_capacity,
        bucket_capacity,
        strategy,
        extra_columns=0,
        seed=0,
        init=(2, -0.1, 0.1),
        extra_init=0.0,
        half_life=None,
    ):
        self.dim, self.row_width = dim, dim + extra_columns
        self.bc, self.strategy, self.seed = bucket_capacity, strategy, seed
        self.init, self.extra_init = init, extra_init
        self.half_life = half_life  # DECAYED strategies: steps
        self.nb, self.max_nb = bucket_counts(init_capacity, capacity, bucket_capacity)
        self.entries = {}  # key -> [row, score, timestamp]
        self.buckets = {}  # home bucket -> set of keys (eviction strategies)
        self.step = 0
        self.evict_below = None
        self.pinned = set()  # keys no new key may evict (core/table_ops.h "Pins")

    # -- helpers
    def _home(self, key):
        return bucket_of(key, self.nb)

    def _rebucket(self):
        self.buckets = {}
        for k in self.entries:
            self.buckets.setdefault(self._home(k), set()).add(k)

    def _new_row(self, key):
        mode, a, b = self.init
        return init_row(key, self.seed, mode, a, b, self.dim, self.row_width, self.extra_init)

    def _score_new(self, i, scores, batch):
        if self.strategy == CUSTOMIZED:
            return int(scores[i])
        if self.strategy in (LFU, TIMESTAMP_LFU):
            return 1
        if self.strategy == CACHE:
            return 1 << 32 | batch
        if self.strategy in DECAYED:
            return decay.touched(None, self.step, 1, self.half_life)
        return batch if self.strategy in (TIMESTAMP, STEP) else 0

    def _touch(self, e, i, scores, batch):
        if self.strategy == CUSTOMIZED:
            e[1] = int(scores[i])
        elif self.strategy in (LFU, TIMESTAMP_LFU):
            e[1] = min(e[1] + 1, MAX_SCORE)  # counts saturate
        elif self.strategy in (TIMESTAMP, STEP):
            e[1] = max(e[1], batch)
        elif self.strategy == CACHE and batch > e[1] & CACHE_BATCH_MASK:
            uses = e[1] >> 32
            e[1] = min(uses + 1, CACHE_MAX_USES) << 32 | batch
        elif self.strategy in DECAYED:
            e[1] = decay.touched(e[1], self.step, 1, self.half_life)
        if self.strategy in STAMPED:
            e[2] = batch

    # -- one key
    def _upsert_one(self, i, key, scores, batch, new_values, evicted):
        status = self._place(i, key, scores, batch, new_values, evicted)
        e = self.entries.get(key)
        self.rows[i] = (e[0] if status != FAILED else self._new_row(key)).copy()
        return status

    def _place(self, i, key, scores, batch, new_values, evicted):
        e = self.entries.get(key)
        if e is not None:
            self._touch(e, i, scores, batch)
            if new_values is not None:
                e[0][: new_values.shape[1]] = new_values[i]
            return HIT
        row = self._new_row(key)
        if new_values is not None:
            row[: new_values.shape[1]] = new_values[i]
        score = self._score_new(i, scores, batch)
        stamp = batch if self.strategy in STAMPED else 0
        if self.strategy == NO_EVICTION:
            # Placement is not modelled (see module doc): the test drops the keys the
            # table failed after checking that their window was full.
            self.entries[key] = [row, score, stamp]
            return INSERTED
        home = self._home(key)
        members = self.buckets.setdefault(home, set())
        if len(members) < self.bc:
            self.entries[key] = [row, score, stamp]
            members.add(key)
            return INSERTED
        if self.nb < self.max_nb:
            return FAILED
        # The eviction floor pins the residents whose score (its batch part, for a
        # cache tier) is not below it.
        mask = CACHE_BATCH_MASK if self.strategy == CACHE else ~0
        unpinned = [
            k
            for k in members
            if (self.evict_below is None or self.entries[k][1] & mask < self.evict_below)
            and k not in self.pinned
        ]
        if not unpinned:
            return FAILED
        victim = min(unpinned, key=lambda k: (self.entries[k][1], digest_of(k), k))
        if self.strategy == CUSTOMIZED and score < self.entries[victim][1]:
            return FAILED
        old = self.entries.pop(victim)
        evicted[i] = (victim, old[0].copy(), old[1])
        members.discard(victim)
        members.add(key)
        self.entries[key] = [row, score, stamp]
        return EVICTED

    def upsert(
        self, keys, scores=None, values=None, batch_value=0, evict_below=None, in_flight=(),
        pins=True,
    ):  # fmt: skip
        """Returns (status list, {position: (key, row, score)} of evicted residents).

        ``self.rows[i]`` is then the row key i saw when it was processed.
        ``evict_below``: a full bucket evicts only a resident scored below it (None:
        any resident; core/table_ops.h UpsertArgs::evict_below), the minimum of those.
        The batch rule of core/table_ops.h: under an evicting strategy every stored key
        is touched before any new key is placed, and no key is evicted that is in
        ``in_flight`` (keys of other batches in flight) or that this batch found or
        stored (unless ``pins`` is False: a restore's keys compete by score).
        """
        self.evict_below = evict_below
        self.pinned = set(map(int, in_flight))
        self.step += 1
        self.rows = [None] * len(keys)
        batch = self.step if self.strategy == STEP else batch_value
        status = [None] * len(keys)
        evicted = {}
        pending = list(range(len(keys)))
        if self.strategy != NO_EVICTION:  # hits first
            for i in pending:
                if int(keys[i]) in self.entries:
                    status[i] = self._upsert_one(i, int(keys[i]), scores, batch, values, evicted)
                    if pins:
                        self.pinned.add(int(keys[i]))
            pending = [i for i in pending if status[i] is None]
        while True:
            for i in pending:
                status[i] = self._upsert_one(i, int(keys[i]), scores, batch, values, evicted)
                if pins and status[i] != FAILED:
                    self.pinned.add(int(keys[i]))
            pending = [i for i in pending if status[i] == FAILED]
            if not pending or self.nb >= self.max_nb:
                return status, evicted
            self.nb = next_bucket_count(
                self.nb, self.max_nb, self.strategy != NO_EVICTION, len(self.entries), self.bc
            )
            self._rebucket()

    def find(self, key):
        e = self.entries.get(int(key))
        return None if e is None else e[0]

    def erase(self, keys):
        erased = 0
        for k in map(int, keys):
            if self.entries.pop(k, None) is not None:
                erased += 1
                self.buckets.get(self._home(k), set()).discard(k)
        return erased

    def drop(self, key):
        """Forgets a key the table legitimately failed to store (NO_EVICTION)."""
        self.entries.pop(int(key), None)

    def capacity(self):
        return self.nb * self.bc


def window_full(table, key: int) -> bool:
    """True when key's NO_EVICTION buckets (home, and second) are full in `table`."""
    s = table.buffers
    nb, bc = s.num_buckets, s.layout.bucket_capacity
    buckets = {bucket_of(key, nb)} | ({second_bucket_of(key, nb)} if nb > 1 else set())
    occupied = (s.digests != 0).sum(dim=1)
    return all(int(occupied[b]) == bc for b in buckets)


def isclose_rows(a, b, tol=1e-6):
    return np.allclose(
        np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64), atol=tol, rtol=0
    )
