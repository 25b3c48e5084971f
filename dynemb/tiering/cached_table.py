"""``CachedTable``: a fast scored hash table caching a slow ``Storage`` (caching mode).

Layout. Two tiers: the *cache*, a ScoredHashTable of ``cache_capacity`` rows that the
embedding kernels read and update by slot exactly as an ordinary table, and the
*storage* (dynemb.tiering.Storage), which holds every row. A row is the full value
row (embedding + optimizer state). While a key is cached its cache row is the
truth; the storage may keep an older copy, overwritten when the key leaves the
cache. So the table's content is the union of both tiers, the cache winning.

Scores. The cache's own score of a slot (the C++ ``scores`` buffer; its claims use
the internal strategy ``ScoreStrategy::kCache``, csrc/core/score_policy.h) holds the
number of the latest batch that needs the key (the training batch that looked it
up, or the future batch it was prefetched for) and, above it, how many batches
used the key since it entered the cache. A full bucket evicts the unpinned
resident used least often, the older among equals: on W-train's Zipf ids this
keeps ~4 points more hits than evicting the oldest (0.52 -> 0.56 at 25%). The key's
score under the table's strategy (what a slow-tier eviction and the checkpoints
see) is kept beside it, ``user_scores[slot]``, updated by each training lookup
with the strategy's rule, and written back with the row. A compound (TIMESTAMP,
LFU) / (TIMESTAMP, DECAYED_LFU) keeps two columns a slot, ``user_scores[slot] =
(score, last-access time)``, as the slow tier keeps its ``scores`` and
``timestamps``: every move between the tiers (fills, write-backs, the staging
area, checkpoints through the slow tier) carries both.

Pinning. Every batch is *in flight* from its prefetch (or forward) until its
backward, or until its forward's graph is dropped without one (batch_ledger.py),
however many forwards precede one backward. A cache insert may evict a victim only
if its batch number is below the oldest batch in flight
(``UpsertArgs::evict_below``, csrc/core/table_ops.h), so the rows of a batch stay
at their slots until its backward is done. A key whose bucket holds only pinned
rows is *staged*: its row (from the storage, or initial) goes to the table's
staging area (staging.py), which the kernels read and update like the cache; a
later batch in flight that looks the key up shares that row, and the row is
written back to the storage when the last of them ends (the key is kept out of
the cache meanwhile). So a cache too small for the batches in flight is slower,
never wrong.

Lookup of a training batch b (distinct keys):
  1. one slot claim in the cache: the hits' batch number rises to b (pin), all
     before any miss takes a slot, so the batch never evicts its own keys; every
     miss gets a slot with batch number b, its row untouched;
  2. the misses' rows come from the storage: found keys with their rows, new keys
     with initial rows (a pure function of (seed, key), so a key gets the row it
     would get in an uncached table);
  3. the rows of the residents evicted in step 1 are read out, the rows of step 2
     written into the slots, and the evicted entries (row + optimizer state +
     score) written back to the storage; what the storage drops is counted;
  4. keys step 1 could not place are staged, and keys staged by batches in flight
     join them (see Pinning).
A batch prefetched whole skips all this in its forward: the prefetch did it.
Eval lookups read the cache, then the storage, and insert nothing.
"""

import torch

from dynemb import _ops, streams
from dynemb._host_reads import read_to_host
from dynemb.config.storage import Storage
from dynemb.config.types import DynamicEmbScoreStrategy
from dynemb.eviction_rules import RuleThresholds, stale_slots
from dynemb.table.batch_arguments import TIMESTAMP_CODES, strategy_code
from dynemb.table.padded_keys import PaddedKeys
from dynemb.table.scored_hash_table import BatchStats, ScoredHashTable
from dynemb.table.table_storage import TableStorage
from dynemb.table.upsert_counts import TableTelemetry
from dynemb.tiering.backing import HashTableStorage, ScoreContext
from dynemb.tiering.batch_ledger import BatchHold
from dynemb.tiering.cache import Cache
from dynemb.tiering.cache_fill import CacheFill
from dynemb.tiering.cache_state import CacheState
from dynemb.tiering.cache_stats import CacheStats
from dynemb.tiering.staging import Staged, StagingArea, private_table

_STEP = DynamicEmbScoreStrategy.STEP.value
# Strategies scored by the table's step: a training lookup counts one.


class CachedTable(Cache):
    """A cache (ScoredHashTable) in front of a Storage; see the module docstring.

    Args:
        cache: the fast table (STEP strategy, no growth, ``extra_columns`` = state).
        storage: the slow tier holding every row.
        score_strategy: the table's score strategy (``user_scores`` rule); a
            compound (TIMESTAMP, LFU) / (TIMESTAMP, DECAYED_LFU) needs the built-in
            slow tier (a Storage keeps one score column).
        capacity: the table's configured ``max_capacity`` (initializer bounds).
        name: the table's name, for messages about its storage.
        score_half_life_steps: DECAYED_LFU's half-life (with it only, checked by the
            table's options).

    It is a ``dynemb.table.Table`` (the cache's buffers, lock and initializer; a
    ``mutations`` count of its own) whose batches, prefetches, eval reads and
    checkpoint content involve both tiers.
    """

    def __init__(
        self,
        cache: ScoredHashTable,
        storage: Storage,
        score_strategy,
        capacity: int,
        name: str = "",
        score_half_life_steps: int | None = None,
    ) -> None:
        if cache.strategy_code != _STEP or cache.capacity() != cache.max_capacity():
            raise ValueError("the cache must be a STEP table allocated at full capacity")
        self.cache = cache
        self.storage = storage
        self.name = name
        self.score_strategy = score_strategy
        self.score_half_life_steps = score_half_life_steps
        self._strategy = (
            int(score_strategy)
            if isinstance(score_strategy, int)
            else strategy_code(score_strategy)
        )
        if self._strategy in TIMESTAMP_CODES and not isinstance(storage, HashTableStorage):
            raise ValueError(
                f"table {name!r}: score_strategy={score_strategy!r} keeps a last-access time "
                f"a row, which storage {type(storage).__name__} cannot store (a Storage keeps "
                "one score); use the built-in slow tier"
            )
        self._capacity = capacity
        self.dim = cache.dim
        self.extra_columns = cache.extra_columns
        self.seed = cache.seed
        self.warm_start = None  # a TableFill, read by keys new to both tiers (cache_fill)
        backing = self.backing_table()
        self._ctx = backing if backing is not None else ScoreContext()
        # (slots,), or (slots, 2) of (score, last-access time) for the compounds
        score_columns = 2 if self._strategy in TIMESTAMP_CODES else 1
        shape = (cache.capacity(),) + ((2,) if score_columns == 2 else ())
        self.state = CacheState(
            cache=cache,
            storage=storage,
            backing=backing,
            name=name,
            stats=CacheStats(),
            user_scores=torch.zeros(shape, dtype=torch.int64, device=cache.device),
            staging=StagingArea(
                cache.dim + cache.extra_columns, cache.value_dtype, cache.device, score_columns
            ),
        )
        self.filler = CacheFill(self.state, self._strategy, self._ctx, score_half_life_steps)
        self._moves = 0  # bumped when cached rows may have moved (empty_cache, erase)
        self._dirty = False  # cache rows may differ from the storage's copies
        # batch -> (keys, slots, moves) of a prefetch that cached every key: the
        # batch's lookup of the same keys tensor reuses the slots while no row moved.
        self._prefetched: dict[int, tuple] = {}

    # ------------------------------------------------------------------ sizes

    @property
    def buffers(self):
        """The cache's buffers (a TableStorage)."""
        return self.cache.buffers

    @property
    def lock(self):
        return self.cache.lock

    @property
    def mutations(self) -> int:
        """Bumped whenever cached rows may have moved (clear, erase): the TBE module then
        finds a batch's keys again."""
        return self._moves

    @property
    def init_values(self) -> list:
        return self.cache.init_values

    @property
    def value_dtype(self) -> torch.dtype:
        return self.cache.value_dtype

    @property
    def device(self) -> torch.device:
        return self.cache.device

    @property
    def bucket_capacity(self) -> int:
        return self.cache.bucket_capacity

    def capacity(self) -> int:
        """Rows of the cache."""
        return self.cache.capacity()

    def max_capacity(self) -> int:
        """The table's configured capacity: the keys the slow tier holds, which after
        every ``sync`` (checkpoints, ``size``, incremental dumps) is the whole table.

        Between syncs the cache may hold up to ``capacity()`` keys more that the slow
        tier has not taken yet (a key enters the slow tier when it leaves the cache), and
        they are findable: an evicting slow tier then drops its lowest-scored keys as
        they arrive. A sync writes every cached key back and drops from the cache the
        ones the slow tier did not keep (keys of batches in flight stay until their
        backward), so that after a sync with no batch in flight the table holds no more
        keys than an uncached table of this ``max_capacity``. Holding it at every step
        instead would take a slow-tier insert for every key new to the table and a
        cache eviction for every slow-tier eviction of a cached key."""
        return self._capacity

    @property
    def strategy_code(self) -> int:
        """The score strategy's code (ScoredHashTable's ``strategy_code``)."""
        return self._strategy

    @property
    def score_step(self) -> int:
        """Training lookups counted so far (ScoredHashTable's ``score_step``; the slow
        tier's when it is built in, which a checkpoint keeps)."""
        return self._ctx.score_step

    def cache_size(self) -> int:
        return self.cache.size()

    def backing_table(self) -> ScoredHashTable | None:
        """The built-in slow table, or None when the storage is external."""
        return self.storage.table if isinstance(self.storage, HashTableStorage) else None

    @property
    def stats(self) -> CacheStats:
        """The cache's counters (``state.stats``)."""
        return self.state.stats

    def reset_stats(self) -> None:
        """Starts the cache's counters from zero."""
        self.state.stats = CacheStats()

    # ------------------------------------------------------------- eval reads

    @property
    def telemetry(self) -> TableTelemetry:
        """The cache's TableTelemetry: every claim of its slots (training lookups and
        prefetches); its evictions move rows to the slow tier (lost rows: ``cache_stats``)."""
        return self.cache.telemetry

    def find(self, keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """ScoredHashTable.find over both tiers: ``(values (n, dim), found (n,) bool)``,
        zero rows where not found; changes nothing."""
        values, found = self.read_rows(keys.contiguous())
        values[~found] = 0
        return values, found

    def read_rows(self, keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Eval lookup: rows ((n, dim), value dtype) from the cache, else the staging
        area, else the storage; found (n,) bool. Inserts nothing, changes no score."""
        self._settle()
        with self.lock.read():
            s = self.buffers
            slots = _ops.table_find_slots(s.tensors(), keys)
            rows = s.values[slots.clamp(min=0), : self.dim].clone()
            found = slots >= 0
            miss = torch.nonzero(~found, as_tuple=True)[0]
            if miss.numel() and len(self.state.staging):
                staged_rows, staged = self.state.staging.rows(keys[miss])
                rows[miss[staged]] = staged_rows[staged, : self.dim]
                found[miss[staged]] = True
                miss = miss[~staged]
            if miss.numel():
                with self.state.storage_lock:
                    slow_rows, _, slow_found = self.filler.storage_find(keys[miss])
                rows[miss] = slow_rows[:, : self.dim].to(rows.dtype)
                found[miss] = slow_found
        return rows, found

    def eval_rows(self, keys: torch.Tensor) -> tuple[TableStorage, torch.Tensor]:
        """Where an eval lookup reads distinct keys' rows: a private storage of the rows
        found in either tier (``read_rows``), and each key's slot there (-1: not stored).
        Inserts nothing."""
        stored, found = self.read_rows(keys)
        at = torch.nonzero(found, as_tuple=True)[0]
        slots = torch.full_like(keys, -1)
        slots[at] = torch.arange(at.numel(), device=keys.device)
        return private_table(stored[at]), slots

    def batch_rows(
        self, slots: torch.Tensor, batch: BatchHold
    ) -> tuple[TableStorage | None, torch.Tensor]:
        """Where a training forward reads its distinct keys' rows, ``slots`` those of
        its lookup under ``batch``: the cache (``(None, slots)``, read under
        ``lock.read()``) when every key is cached; else one private storage of the
        batch's rows, cached and staged, slot i holding distinct key i's, so the bags
        are pooled in one pass, as without caching."""
        staged = batch.payload
        if staged is None:
            return None, slots
        with self.lock.read():
            rows = staged.batch_rows(self.buffers, slots)
        at = torch.arange(slots.numel(), device=slots.device)
        # -1 for keys held nowhere (not admitted): they read the missing-row initializer
        return rows, torch.where((slots < 0) & (staged.unique_slots < 0), -1, at)

    def staged_rows(self, batch: BatchHold) -> tuple[TableStorage, torch.Tensor] | None:
        """Rows of ``batch`` held outside the cache, which its backward updates as the
        cache's: ``(storage, unique_slots)`` of its staged keys (-1 for the cached
        ones), or None when it staged none."""
        staged = batch.payload
        return None if staged is None else (staged.storage, staged.unique_slots)

    # ---------------------------------------------------------- batch numbers

    def begin_batch(self) -> BatchHold:
        """Starts a training forward: returns its hold (numbered as the oldest pending
        prefetch, or anew), in flight until ``end_batch`` or until it is dropped (a
        forward whose graph is dropped without backward: the table then ends it,
        staged rows included, at its next call)."""
        return self.state.batches.begin_forward()

    def end_batch(self, batch: BatchHold) -> None:
        """The batch's backward is done: its rows may be evicted again, and its staged
        rows that no other batch in flight holds go back to the storage."""
        staged = batch.payload
        batch.release()
        if staged is not None:
            self.filler.unstage(staged)
        self._settle()
        self._dirty = True

    def batches_in_flight(self) -> int:
        """Batches in flight (forwards before their backward, pending prefetches)."""
        self._settle()
        return self.state.batches.in_flight()

    def staged_keys(self) -> int:
        """Keys staged now (held by batches in flight, outside the cache)."""
        return len(self.state.staging)

    def upcoming_batch(self) -> int | None:
        """The number the next ``begin_batch`` takes from a prefetch, or None."""
        return self.state.batches.upcoming()

    def skip_batch(self) -> None:
        """A training forward without keys of this table takes a batch number too, so
        that the numbers stay in step with the prefetches."""
        self.end_batch(self.begin_batch())

    has_cache = True  # prefetch, cache_stats and empty_cache act on the cache
    takes_padded_keys = True  # its claim reads the device anyway: their count rides along

    @property
    def cache_stats(self) -> CacheStats:
        """The cache's counters (``stats``)."""
        return self.state.stats

    @property
    def groups_lookups(self) -> bool:
        """False: its lookups claim cache slots, one table at a time."""
        return False

    def record_lookup(self, keys: torch.Tensor) -> None:
        """None: a cache's lookups never fail (keys it cannot take are staged): no undo."""
        return None

    # ---------------------------------------------------------------- lookups

    def find_slots(self, keys: torch.Tensor) -> torch.Tensor:
        """Cache slots of keys (-1 where not cached); changes nothing."""
        return self.cache.find_slots(keys)

    def contains(self, keys: torch.Tensor) -> torch.Tensor:
        """(n,) bool: whether each key is stored in either tier (cached, staged or in the
        storage); changes nothing. Admission counts only keys it says are not."""
        self._settle()
        with self.lock.read():
            found = _ops.table_find_slots(self.buffers.tensors(), keys) >= 0
            busy = self.state.staging.busy(keys)
            if busy is not None:
                found |= busy
            rest = torch.nonzero(~found, as_tuple=True)[0]
            if rest.numel():
                backing = self.backing_table()
                with self.state.storage_lock:
                    if backing is not None:
                        found[rest] = backing.contains(keys[rest])
                    else:
                        found[rest] = self.filler.storage_find(keys[rest])[2]
        return found

    def widen_batch(self, batch: BatchHold, positions: torch.Tensor, count: int) -> None:
        """The lookup under ``batch`` was of ``positions`` ((m,) int64) of the forward's
        ``count`` distinct keys (admission: the others are stored nowhere): its staged
        keys are re-addressed by position among all ``count``, so that ``batch_rows``
        and ``staged_rows`` line up with the forward's keys (-1: not staged)."""
        staged = batch.payload
        if staged is not None:
            wide = torch.full((count,), -1, dtype=torch.int64, device=positions.device)
            wide[positions] = staged.unique_slots
            staged.unique_slots = wide

    def lookup(
        self, keys: torch.Tensor, accesses: torch.Tensor | None, batch: BatchHold
    ) -> tuple[torch.Tensor, Staged | None]:
        """Training lookup of a batch's distinct keys (steps 1-4 of the module doc).

        Args:
            keys: (U,) int64, distinct, or a forward's PaddedKeys (with their counts).
            accesses: (U,) int64 occurrences, or None. batch: ``begin_batch``'s hold.

        Returns:
            ``(slots, staged)``: (U,) int64 cache slots (-1 for staged keys) and the
            Staged keys (None when every key is cached). The caller applies the
            backward to both, then calls ``end_batch``.
        """
        self._settle()
        with self.lock.write():
            ready = self._prefetched.get(batch.number)
            reuse = ready is not None and ready[0] is keys and ready[2] == self._moves
            warm = None
            if self.warm_start is not None and not reuse:  # read before anything changes
                if isinstance(keys, PaddedKeys):
                    keys, _, accesses = keys.sized()
                warm = self.filler.read_warm(self.warm_start, keys)
            self._prefetched.pop(batch.number, None)
            # Every strategy steps: probabilistic admission draws at the table's step.
            self._ctx.score_step += 1
            now = _ops.batch_value(self._strategy, self._ctx.score_step, self._ctx.now)
            keys, accesses, claim = self.filler.claim_padded(keys, accesses, batch.number)
            if reuse:
                slots, hits = ready[1], keys.numel()  # pinned for `batch`
                streams.used_here((slots,))  # made on the prefetch's stream
                failed = joined = None
            else:
                slots, hits, failed, joined = self.filler.fill(
                    keys, batch.number, stage=True, claim=claim, warm=warm
                )
            live, acc = slots, accesses
            if failed is not None or joined is not None:  # staged keys have no slot
                ok = slots >= 0
                live, acc = slots[ok], None if accesses is None else accesses[ok]
            # index_select / index_copy_: about half the time of indexed get and set
            scores = self.state.user_scores.index_select(0, live)
            self.state.user_scores.index_copy_(0, live, self.filler.rescore(scores, acc, now))
            self.state.stats.lookup_keys += keys.numel()
            self.state.stats.lookup_hits += hits
            staged = None
            if failed is not None or joined is not None:  # under the lock: no key moves
                staged = batch.payload = self.filler.stage(keys, accesses, failed, joined, now)
        self._dirty = True
        return slots, staged

    def find_or_insert_slots(
        self, keys: torch.Tensor, accesses: torch.Tensor | None = None, hold=None
    ) -> tuple[torch.Tensor, BatchStats]:
        """ScoredHashTable's training lookup. With ``hold`` (a ``begin_batch``'s): the
        ``lookup`` of that batch, whose staged keys (slot -1) are served by
        ``batch_rows`` and ``staged_rows``, so none fails. Without: a lookup that ends
        at once (no backward); keys the cache cannot take (or that a batch in flight
        staged) are reported failed, their rows back in the storage once no batch in
        flight holds them. Its BatchStats (also ``cache.last_stats``) count cache hits,
        keys brought into the cache (``inserted``) and keys it could not take."""
        hits_before, staged_before = self.state.stats.lookup_hits, self.state.stats.staged
        batch = self.begin_batch() if hold is None else hold
        slots, _ = self.lookup(keys, accesses, batch)
        keys = keys.sized()[0] if isinstance(keys, PaddedKeys) else keys  # read by the lookup
        hits = self.state.stats.lookup_hits - hits_before  # keys already in the cache
        if hold is not None:
            staged = self.state.stats.staged - staged_before
            return slots, BatchStats(hits, keys.numel() - staged - hits, 0, 0, keys[:0])
        self.end_batch(batch)
        failed = slots < 0
        n_failed = read_to_host(failed.sum(), "failed count").item()
        stats = BatchStats(hits, keys.numel() - n_failed - hits, 0, n_failed, keys[failed])
        self.cache.last_stats = stats
        return slots, stats

    def prefetch(self, keys: torch.Tensor) -> int:
        """Brings distinct keys of a future training batch into the cache and pins
        them until that batch's backward; the next ``begin_batch`` takes its number.

        Returns the batch number.
        """
        self._settle()
        if not keys.numel():
            return self._begin_prefetch()
        with self.lock.write():
            warm = self.filler.read_warm(
                self.warm_start, keys
            )  # before the batch is numbered: a failure changes nothing
            b = self._begin_prefetch()
            slots, hits, _, _ = self.filler.fill(keys, b, stage=False, warm=warm)
            self.state.stats.prefetch_keys += keys.numel()
            self.state.stats.prefetch_hits += hits
            if read_to_host((slots >= 0).all(), "all cached").item():
                self._prefetched[b] = (keys, slots, self._moves)  # its lookup may reuse them
        return b

    def _begin_prefetch(self) -> int:
        """Numbers a prefetch's batch (pending until its forward)."""
        b, retired = self.state.batches.begin_prefetch()
        for old in retired:
            self._prefetched.pop(old, None)
        return b

    def _settle(self) -> None:
        """Ends the batches whose holds were dropped unreleased: their staged rows
        that no other batch holds go home (call it holding no lock of the table)."""
        dropped = self.state.batches.dropped()
        for staged in dropped:
            self.filler.unstage(staged)
        if dropped:
            self._dirty = True

    # ------------------------------------------------------------ whole table

    def sync(self) -> None:
        """Writes every cached and staged row (and score) back to the storage; the
        cache and the staging area keep them. After it the storage alone holds the
        whole table."""
        self._settle()
        with self.lock.write():
            if not self._dirty:
                return
            s = self.buffers
            slots = s.occupied(0, s.num_slots)
            if slots.numel():
                keys = s.keys[slots]
                self.filler.write_back(keys, s.values[slots], self.state.user_scores[slots])
                self._drop_unkept(keys, s.scores[slots])
            if len(self.state.staging):
                self.filler.write_back(*self.state.staging.entries())
            self._dirty = False

    def _drop_unkept(self, keys: torch.Tensor, cache_scores: torch.Tensor) -> None:
        """After a sync's write-back of the cached ``keys``: the ones the slow tier did not
        keep (refused, or evicted by the same write-back) leave the cache too, so that the
        table holds at most ``max_capacity`` keys after every sync (see ``max_capacity``).
        They were counted in ``cache_stats.storage_drops``. Keys of batches in flight stay
        (``cache_scores``: their cache scores): their backward writes their slots."""
        backing = self.backing_table()
        with self.state.storage_lock:
            kept = (
                backing.contains(keys) if backing is not None else self.filler.storage_find(keys)[2]
            )
        pinned = (cache_scores & _ops.CACHE_BATCH_MASK) >= self.state.batches.floor()
        drop = ~kept & ~pinned
        if read_to_host(drop.any(), "keys dropped").item():
            self.cache.erase_held(keys[drop])
            self._moves += 1

    def empty_cache(self) -> None:
        """``sync`` then empties the cache (e.g. before loading into the storage)."""
        self.sync()
        self.cache.clear()
        with self.lock.write():
            self.state.user_scores.zero_()
            self._moves += 1

    def flush(self) -> None:
        """ScoredHashTable.flush: ``sync``, then the built-in slow tier commits its spill
        directory (a no-op in memory); the cache keeps its rows."""
        self.sync()
        backing = self.backing_table()
        if backing is not None:
            backing.flush()

    def persistent_table(self) -> ScoredHashTable:
        """The built-in slow table after a ``sync``: the whole table, for checkpoints.

        Raises:
            ValueError: when the slow tier is an external storage (persist it yourself
                through its ``export_batch``).
        """
        backing = self.backing_table()
        if backing is None:
            raise ValueError(
                f"this cached table's slow tier is an external storage "
                f"({type(self.storage).__name__}); dump it through the Storage "
                f"interface (sync() then storage.export_batch)"
            )
        self.sync()
        return backing

    def rule_thresholds(self, rule):
        """``RuleThresholds`` of an ``EvictionRule`` now (the slow tier's step and
        clock, read once on the host); syncs the cache, so the slow tier's scores are
        those of every access so far."""
        self.persistent_table()  # syncs; raises for an external storage
        return RuleThresholds.of(
            rule, self._strategy, self._ctx.score_step, self._ctx.now(), self.score_half_life_steps
        )

    def erase_stale_buckets(self, thresholds, begin: int, end: int) -> tuple[torch.Tensor, int]:
        """ScoredHashTable.erase_stale_buckets over the slow tier's buckets, erasing
        from both tiers. Kept: keys of batches in flight (pinned in the cache, or
        staged) and, once the cache has trained since ``rule_thresholds`` synced it,
        every cached key (its slow-tier score may be older than its last access)."""
        backing = self.backing_table()
        if backing is None:
            raise ValueError(f"table {self.name!r}: eviction by rule needs the built-in slow tier")
        with backing.lock.read():
            s, cap = backing.buffers, backing.bucket_capacity
            n = s.num_buckets
            slots = s.occupied(min(begin, n) * cap, min(end, n) * cap)
            keys = (
                s.keys[slots[stale_slots(s, slots, thresholds, self.dim)]]
                if slots.numel()
                else s.keys[:0]
            )
        if keys.numel():
            self._settle()
            cache = self.cache
            with self.lock.read():  # the cache's lock: its slots and pins stay put
                at = _ops.table_find_slots(cache.buffers.tensors(), keys)
                cached = at >= 0
                pins = cache.buffers.pins[at.clamp(min=0)]
                keep = cached & (pins >= cache.state.pins.floor()) if not self._dirty else cached
                staged = self.state.staging.busy(keys)
                if staged is not None:
                    keep |= staged
                keys = keys[~keep]
            if keys.numel():
                self.erase(keys)
        return keys, n

    def size(self) -> int:
        """Distinct keys in both tiers (syncs the cache first)."""
        self.sync()
        return self.storage.size()

    def erase(self, keys: torch.Tensor) -> int:
        """Removes keys from both tiers; returns how many were stored in either (a
        repeated key counts once)."""
        keys = torch.unique(keys)
        self._moves += 1
        in_cache = self.cache.erase_keys(keys)
        with self.lock.write():  # (a lookup stages under it)
            staged = self.state.staging.forget(keys)  # their batches train them; nothing goes home
        with self.state.storage_lock:
            _, _, found = self.filler.storage_find(keys)
            self.storage.erase(keys[found])
        return read_to_host((in_cache | staged | found).sum(), "stored count").item()


__all__ = ["CacheStats", "CachedTable"]
