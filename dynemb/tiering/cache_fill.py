"""How a cached table fills its cache: steps 1-4 of cached_table.py's module doc (claim
slots, move victims out and fetched rows in, write victims back, stage the keys left
over), how staged rows go home, and the score rule of the rows it holds.

``CacheFill`` is a part that a CachedTable holds (``filler``): it works on the table's ``CacheState``
(cache_state.py), which it receives, and keeps its own scratch buffers.

Score entries: a key's scores under the table's strategy move as one int64 (n,)
tensor, or (n, 2) of (score, last-access time) for the compounds (TIMESTAMP, LFU) /
(TIMESTAMP, DECAYED_LFU), which the built-in slow tier stores as its ``scores`` and
``timestamps``.
"""

import torch

from dynemb import _ops
from dynemb._host_reads import read_to_host
from dynemb.config.types import DynamicEmbScoreStrategy
from dynemb.table.padded_keys import PaddedKeys
from dynemb.table.scored_hash_table import ScoredHashTable
from dynemb.tiering.cache_state import CacheState
from dynemb.tiering.staging import Staged
from dynemb.tiering.storage_results import checked_find, checked_insert
from dynemb.warm_start.table_fill import NewRows

_CUSTOMIZED = DynamicEmbScoreStrategy.CUSTOMIZED.value


def _positions(mask: torch.Tensor, count: int) -> torch.Tensor:
    """Positions of the ``count`` True entries of ``mask``, a count the claim's status
    counts gave already: no read of the device sizes them (as ``torch.nonzero`` would)."""
    return torch.nonzero_static(mask, size=count).view(-1)


class CacheFill:
    """Cache fills and write-backs of a CachedTable.

    Args:
        state: the table's CacheState (both tiers, staging area, batch ledger, scores).
        strategy: the table's score strategy code (``user_scores``' rule).
        ctx: where the table's score step and clock live (its built-in slow tier, or a
            ScoreContext of its own).
        half_life: DECAYED_LFU's half-life in steps, or None.
    """

    def __init__(self, state: CacheState, strategy: int, ctx, half_life: int | None) -> None:
        self.state = state
        self._strategy = strategy
        self._ctx = ctx
        self._half_life = half_life
        self._buffers: dict[str, torch.Tensor] = {}  # see _scratch

    def storage_find(self, keys: torch.Tensor):
        """``storage.find(keys)`` with its results checked (storage_results.py); the
        caller holds the storage lock."""
        width = self.state.cache.dim + self.state.cache.extra_columns
        return checked_find(
            self.state.storage, keys, width, self.state.cache.value_dtype, self.state.name
        )

    def claim_padded(self, keys, accesses, batch: int):
        """Step 1 on a forward's padded distinct keys (a PaddedKeys, its ``counts`` the
        accesses), whose count the claim's read takes along (padded_keys.py): returns
        ``(keys (U,), accesses (U,), claim)``, ``claim`` the ``(slots, status, counts)``
        that ``_fill`` takes, or None when keys staged by batches in flight must be told
        apart first (then sized by a read of their own). Other keys pass through."""
        if not isinstance(keys, PaddedKeys):
            return keys, accesses, None
        if len(self.state.staging):
            keys, _, accesses = keys.sized()
            return keys, accesses, None
        claim = self._claim(keys, batch)
        keys, _, accesses = keys.sized()  # read already, with the claim's counts
        return keys, accesses, claim

    def read_warm(self, source, keys: torch.Tensor) -> NewRows | None:
        """The rows from warm-start ``source`` (a TableFill, or None) of the distinct
        ``keys`` new to both tiers (neither cached, staged nor in the storage), read
        before the claim, under ``lock.write()``, so that a source that fails changes
        nothing (as an uncached table's ``read_new``). None without a source."""
        if source is None:
            return None
        new = _ops.table_find_slots(self.state.cache.buffers.tensors(), keys) < 0
        busy = self.state.staging.busy(keys)
        if busy is not None:
            new &= ~busy
        at = torch.nonzero(new, as_tuple=True)[0]
        if at.numel():
            backing = self.state.backing
            with self.state.storage_lock:
                if backing is not None:
                    stored = backing.contains(keys[at])
                else:
                    stored = self.storage_find(keys[at])[2]
            at = at[~stored]
        width = self.state.cache.dim + source.state_columns
        if not at.numel():
            return NewRows(
                keys.numel(), at, keys.new_empty((0, width), dtype=self.state.cache.value_dtype)
            )
        pos, rows = source.read(keys[at])
        return NewRows(keys.numel(), at[pos], rows)

    def fill(self, keys: torch.Tensor, batch: int, stage: bool, claim=None, warm=None):
        """Steps 1-3 under the cache's write lock.

        One slot claim over the batch pins the hits (their batch number rises to
        ``batch``, all before any new key is placed: core hits_first) and gives every
        other key a slot without touching rows (a victim's row stays in its slot);
        then the victims' rows are read out for the write-back and the fetched rows
        written in: by one C++ op with the built-in slow tier (``_exchange``), by
        whole-batch copies around ``Storage.find`` with an external one. Keys staged
        by batches in flight are not claimed: their rows stay in the staging area.

        ``claim``: ``_claim_padded``'s claim of all keys, done already (no key staged).
        ``warm``: ``_read_warm(keys)``, the rows of the keys new to both tiers (None:
        no warm-start source).

        Returns ``(slots, hits, failed, joined)``: slots (-1 for keys not cached);
        ``failed`` is None, or (with ``stage``) ``(positions, rows, scores)`` of the
        keys the cache could not take; ``joined`` is None, or the positions of the
        keys staged by batches in flight. Positions are in ``keys``.
        """
        claimed = joined = None  # positions of the keys claimed (None: all)
        if claim is None:
            busy = self.state.staging.busy(keys)
            if busy is not None and read_to_host(busy.any(), "staged keys").item():
                claimed = torch.nonzero(~busy, as_tuple=True)[0]
                joined = torch.nonzero(busy, as_tuple=True)[0]
        claim_keys = keys if claimed is None else keys[claimed].contiguous()

        def batch_positions(p):  # positions in claim_keys -> in keys (warm's)
            return p if claimed is None else claimed[p]

        slots, status, counts = claim if claim is not None else self._claim(claim_keys, batch)
        hits = counts[_ops.Status.HIT]
        failed = None
        backing = self.state.backing
        if hits == claim_keys.numel():
            pass
        elif backing is not None:  # one C++ op moves the rows
            found = self._exchange(claim_keys, slots, status, counts, backing)
            if warm is not None and warm.positions.numel():  # keys new to both tiers
                claimed_now = (status == _ops.Status.INSERTED) | (status == _ops.Status.EVICTED)
                new = torch.nonzero(claimed_now & ~found, as_tuple=True)[0]
                at, rows = warm.select(batch_positions(new))
                if at.numel():
                    self.state.cache.buffers.write_rows(slots[new[at]], rows)
            if counts[_ops.Status.FAILED]:
                self.state.stats.not_cached += counts[_ops.Status.FAILED]
                if stage:
                    out = _positions(status == _ops.Status.FAILED, counts[_ops.Status.FAILED])
                    failed = (out, *self._fetch(claim_keys[out], warm, batch_positions(out)))
        else:
            missed = _positions(status != _ops.Status.HIT, claim_keys.numel() - hits)
            rows, scores = self._fetch(claim_keys[missed], warm, batch_positions(missed))
            self._move_in(slots, status, counts, missed, rows, scores)
            if counts[_ops.Status.FAILED]:
                out = _positions(status[missed] == _ops.Status.FAILED, counts[_ops.Status.FAILED])
                self.state.stats.not_cached += counts[_ops.Status.FAILED]
                if stage:
                    failed = (missed[out], rows[out], scores[out])
        if claimed is not None:
            all_slots = torch.full_like(keys, -1)
            all_slots[claimed] = slots
            slots = all_slots
            if failed is not None:
                failed = (claimed[failed[0]], *failed[1:])
        return slots, hits, failed, joined

    def stage(self, keys, accesses, failed, joined, now) -> Staged:
        """Step 4: the keys ``_fill`` could not cache (``failed``) enter the staging
        area, the keys staged by batches in flight (``joined``) are shared; both get
        this lookup's scores."""

        def rule(pos, old):
            return self.rescore(old, None if accesses is None else accesses[pos], now)

        new = None
        if failed is not None:
            pos, rows, scores = failed
            new = (pos, rows.to(self.state.cache.value_dtype), rule(pos, scores))
        staged = self.state.staging.stage(keys, new, joined, lambda old: rule(joined, old))
        self.state.stats.staged += staged.slots.numel()
        return staged

    def unstage(self, staged: Staged) -> None:
        """The batch of ``staged`` ends: the rows no other batch holds go home."""
        with self.state.cache.lock.write():
            back = self.state.staging.release(staged)
            if back is not None:
                self.write_back(*back)

    def _claim(self, keys: torch.Tensor | PaddedKeys, batch: int):
        """Slots for keys (hits pinned, the others claimed, rows untouched); the keys
        evicted go to the "evicted_keys" scratch buffer. Returns (slots, status, counts)
        of the distinct keys (padded keys: of their first ``count()``)."""
        n = keys.unique.numel() if isinstance(keys, PaddedKeys) else keys.numel()
        evicted_keys = self._scratch("evicted_keys", (n,), torch.int64)
        return self.state.cache.claim_cache_slots(
            keys, batch, self.state.batches.floor(), evicted_keys
        )

    def _fetch(
        self, keys: torch.Tensor, warm: NewRows | None = None, at: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows and score entries of keys from the storage; keys it lacks get the
        initial row (a pure function of (seed, key), as an uncached table's insert),
        or the warm-start row read before the claim (``warm``, the keys' positions in
        its batch ``at``), and 0."""
        with self.state.storage_lock:
            rows, scores, found = self.storage_find(keys)
            if self.state.user_scores.dim() == 2:  # a compound: the built-in slow tier's times
                times = self.state.backing.get_timestamps(keys)
                scores = torch.stack([scores, times], dim=1)
        new = torch.nonzero(~found, as_tuple=True)[0]
        self.state.stats.add(fetched=keys.numel() - new.numel())  # no read of a pending count
        if new.numel():
            none = torch.full_like(new, -1)
            init_values = self.state.cache.init_values
            init = _ops.embedding_gather(
                self.state.cache.buffers.tensors(),
                none,
                keys[new],
                init_values,
                self.state.cache.seed,
                self.state.cache.dim,
            )
            rows[new, : self.state.cache.dim] = init.to(rows.dtype)
            init_args = _ops.Init(*init_values)
            zeros = self.state.cache.dim + int(init_args.extra_zeros)
            rows[new, self.state.cache.dim : zeros] = 0
            rows[new, zeros:] = init_args.extra_value
            scores[new] = 0
            if warm is not None and warm.positions.numel():  # read before the claim
                pos, warm_rows = warm.select(at[new])
                rows[new[pos], : warm_rows.shape[1]] = warm_rows.to(rows.dtype)
        return rows, scores

    def _exchange(self, keys, slots, status, counts, backing: ScoredHashTable) -> torch.Tensor:
        """Steps 2-3 with the built-in slow table, whose buffers the cache reads
        directly: one op takes the claim's outputs, moves each victim's row out and
        each new key's row in; then the victims are written back. The claim's
        ``counts`` (read already) size the op's outputs: no read of the device.
        Returns found: (n,) bool, the keys moved in from the slow table."""
        evicted_keys = self._buffers["evicted_keys"][: keys.numel()]
        evicted = counts[_ops.Status.EVICTED]
        with self.state.storage_lock, backing.lock.read():
            victims = _ops.table_cache_exchange(
                self.state.cache.buffers.tensors(), backing.buffers.tensors(), self.state.cache.init_values, self.state.cache.seed,
                self.state.cache.dim, self.state.user_scores, keys, slots, status, evicted_keys,
                counts[_ops.Status.INSERTED] + evicted, evicted,
            )  # fmt: skip
        self.state.stats.add_later(fetched=victims[3].sum())  # read with the next read
        self.write_back(*victims[:3])  # victims[2]: the score entries
        return victims[3]

    def _move_in(self, slots, status, counts, missed, rows, scores) -> None:
        """Writes the fetched rows and scores of the claimed keys (positions
        ``missed``) into their slots, after writing back the residents they evicted."""
        s = self.state.cache.buffers
        victims = None
        if counts[_ops.Status.EVICTED]:  # read before the new rows overwrite them
            out = _positions(status == _ops.Status.EVICTED, counts[_ops.Status.EVICTED])
            at = slots[out]
            victims = (
                self._buffers["evicted_keys"][out],
                s.values.index_select(0, at),
                self.state.user_scores[at],
            )
        at = slots[missed]
        if counts[_ops.Status.FAILED]:  # not cached: no slot to write
            stored = _positions(at >= 0, at.numel() - counts[_ops.Status.FAILED])
            at, rows, scores = at[stored], rows[stored], scores[stored]
        s.values.index_copy_(0, at, rows)  # a row copy per index; indexed assignment is slower
        self.state.user_scores[at] = scores
        if victims is not None:
            self.write_back(*victims)

    def _scratch(self, name: str, shape: tuple, dtype: torch.dtype) -> torch.Tensor:
        """A reusable buffer of at least ``shape[0]`` rows (fresh memory costs page faults)."""
        buf = self._buffers.get(name)
        if buf is None or buf.shape[0] < shape[0]:
            rows = max(shape[0], int(1.5 * (buf.shape[0] if buf is not None else 0)))
            buf = torch.empty((rows, *shape[1:]), dtype=dtype, device=self.state.cache.device)
            self._buffers[name] = buf
        return buf[: shape[0]]

    def write_back(self, keys, rows, scores) -> None:
        """Stores entries in the slow tier; ``scores`` are their score entries."""
        if not keys.numel():
            return
        backing = self.state.backing
        times = None
        if scores.dim() == 2:  # a compound: (score, last-access time)
            scores, times = scores[:, 0], scores[:, 1]
        with self.state.storage_lock:
            if backing is not None:  # its drops counted on the device, read later
                dropped = backing.write_back_counted(keys, rows, scores, times)
                self.state.stats.add_later(storage_drops=dropped)
            else:
                dropped = checked_insert(self.state.storage, keys, rows, scores, self.state.name)
                self.state.stats.storage_drops += dropped.numel()
        self.state.stats.written_back += keys.numel()

    def rescore(self, old: torch.Tensor, accesses: torch.Tensor | None, value: int) -> torch.Tensor:
        """Score entries after a training lookup: ``_rule`` on the scores and, for a
        compound, the last-access time set to ``value`` (the batch's clock), as an
        uncached table's lookup sets its timestamps (core table_ops.h touch / claim)."""
        if old.dim() == 1:
            return self._rule(old, accesses, value)
        out = torch.empty_like(old)
        out[:, 0] = self._rule(old[:, 0].contiguous(), accesses, value)
        out[:, 1] = value
        return out

    def _rule(self, old: torch.Tensor, accesses: torch.Tensor | None, value: int) -> torch.Tensor:
        """Scores after a training lookup under the table's strategy, by the core's
        rule (score_policy.h score_for_hit); a key new to the table starts from 0,
        which gives the rule's score for a new key. ``value``: this batch's
        ``_ops.batch_value``."""
        custom = None
        if self._strategy == _CUSTOMIZED:
            custom = torch.full_like(old, self._ctx.custom_score or 0)
        if self._half_life is None:
            return _ops.scores_after_hit(old, self._strategy, value, accesses, custom)
        half_life, step = self._half_life, self._ctx.score_step  # DECAYED_LFU
        return _ops.scores_after_hit(old, self._strategy, value, accesses, custom, half_life, step)
