"""``StagingArea``: rows of the keys a cache could not take, shared by the batches in flight.

When every slot of a key's cache bucket is pinned by batches in flight, a training
lookup *stages* the key: its row (from the slow tier, or initial) goes to the
table's staging area, which the embedding kernels read and update by slot like the
cache. The key stays there while any batch in flight has looked it up: a later
forward that looks it up again before the earlier one's backward (several towers
over one table) reads and trains the same row, which so receives every forward's
gradient, as in a table in memory. When the last of those batches ends (its
backward, or its graph dropped) the row goes back to the slow tier
(dynemb.tiering.cached_table, Pinning). A key is in the cache or in the area,
never both.

Layout: slot i of ``storage`` (a TableStorage that the ops read by slot only)
holds the row of ``keys[i]`` with its score ``scores[i]`` (the cache's score
columns: a compound's row is (score, last-access time)); ``users[i]`` counts the
batches in flight holding it, and a slot without users is free. An erased key's
slot is dead: kept for its users, found by no lookup, never written back. Growth
copies the rows into a larger storage at the same slots, so a batch's slots stay
valid; read ``Staged.storage`` at each use.
"""

import dataclasses
import math
import threading
from collections.abc import Callable

import torch

from dynemb._host_reads import read_to_host
from dynemb.table.table_storage import TableLayout, TableStorage

_BUCKET = 16  # slots per bucket of the private storages (their hash buffers go unused)


def private_table(rows: torch.Tensor) -> TableStorage:
    """A TableStorage whose slot i holds ``rows[i]`` ((n, row_width), the value dtype)."""
    storage = TableStorage(_layout(rows.shape[1], rows.dtype, rows.device), _buckets(rows.shape[0]))
    storage.values[: rows.shape[0]] = rows
    return storage


@dataclasses.dataclass
class Staged:
    """The keys of one training batch held in a StagingArea.

    Attributes:
        area: the area holding their rows.
        unique_slots: (U,) int64, for each distinct key of the batch its slot in
            ``area.storage``, -1 for the keys the cache holds.
        slots: (F,) int64, the distinct area slots this batch holds.
    """

    area: "StagingArea"
    unique_slots: torch.Tensor
    slots: torch.Tensor

    @property
    def storage(self) -> TableStorage:
        """The area's rows, as the ops read them (the area may have grown)."""
        return self.area.storage

    def batch_rows(self, cache: TableStorage, cache_slots: torch.Tensor) -> TableStorage:
        """The batch's distinct rows gathered in one storage, slot i holding distinct key
        i's row: from the cache where ``cache_slots[i] >= 0``, else from the area. A
        forward pools them in one pass, in the batch's order, so that its bags are
        summed as without caching (pooling the cached and the staged rows apart and
        adding the two results rounds differently).

        Args:
            cache: the cache's storage (the caller holds its read lock).
            cache_slots: (U,) int64, each distinct key's cache slot, -1 for staged keys
                (and for keys not stored, whose rows stay unset).
        """
        width = cache.layout.row_width
        out = TableStorage(
            _layout(width, cache.values.dtype, cache.values.device), _buckets(len(cache_slots))
        )
        cached = torch.nonzero(cache_slots >= 0, as_tuple=True)[0]
        # neither cached nor staged: a key admission stores nowhere (its row is the
        # non-admitted initializer's, see CachedTable.batch_rows)
        staged = torch.nonzero((cache_slots < 0) & (self.unique_slots >= 0), as_tuple=True)[0]
        out.values[cached] = cache.rows(cache_slots[cached], width)
        area = self.storage
        out.values[staged] = area.rows(self.unique_slots[staged], width)
        return out


class StagingArea:
    """Staged rows of one cached table, shared by its batches in flight (thread-safe).

    Args:
        row_width: dim + state columns. value_dtype, device: those of the cache.
        score_columns: 1 (scores (n,)), or 2 (scores (n, 2): score, last-access time).
    """

    def __init__(
        self,
        row_width: int,
        value_dtype: torch.dtype,
        device: torch.device,
        score_columns: int = 1,
    ) -> None:
        self._lock = threading.Lock()
        self.storage = TableStorage(_layout(row_width, value_dtype, device), 1)
        n = self.storage.num_slots
        self._keys = torch.zeros(n, dtype=torch.int64, device=device)
        shape = (n,) if score_columns == 1 else (n, score_columns)
        self._scores = torch.zeros(shape, dtype=torch.int64, device=device)
        self._users = torch.zeros(n, dtype=torch.int32, device=device)
        self._live = torch.zeros(n, dtype=torch.bool, device=device)
        self._reindex()

    def __len__(self) -> int:
        """Keys staged now (live: not erased)."""
        return self._sorted_keys.numel()

    def busy(self, keys: torch.Tensor) -> torch.Tensor | None:
        """(n,) bool: which keys are staged now; None when none is (a cheap test)."""
        with self._lock:
            return None if not len(self) else self._find(keys) >= 0

    def stage(
        self,
        keys: torch.Tensor,
        new: tuple | None,
        joined: torch.Tensor | None,
        rescore: Callable[[torch.Tensor], torch.Tensor],
    ) -> Staged:
        """Holds a batch's staged keys.

        Args:
            keys: (U,) int64, the batch's distinct keys.
            new: None, or ``(pos, rows, scores)``: keys ``keys[pos]`` not staged yet,
                their rows ((F, row_width), the value dtype) and scores after this
                lookup ((F,) or (F, score_columns) int64).
            joined: None, or (J,) int64 positions of keys staged by other batches in
                flight: the batch shares their rows.
            rescore: the joined keys' scores after this lookup, from their scores.

        Returns:
            The batch's Staged (release it with ``release``).
        """
        unique_slots = torch.full_like(keys, -1)
        held = []
        with self._lock:
            if joined is not None and joined.numel():
                at = self._find(keys[joined])
                if read_to_host(
                    (at < 0).any(), "staged keys"
                ).item():  # the caller holds the cache's lock: cannot happen
                    raise RuntimeError("dynemb: a staged key left the staging area mid-lookup")
                self._scores[at] = rescore(self._scores[at])
                unique_slots[joined] = at
                held.append(at)
            if new is not None and new[0].numel():
                pos, rows, scores = new
                at = self._claim(pos.numel())
                self.storage.values[at] = rows
                self._keys[at], self._scores[at] = keys[pos], scores
                self._live[at] = True
                unique_slots[pos] = at
                held.append(at)
            slots = torch.cat(held) if held else keys[:0]
            self._users[slots] += 1
            self._reindex()
        return Staged(self, unique_slots, slots)

    def release(self, staged: Staged) -> tuple | None:
        """The batch of ``staged`` no longer holds its keys. Returns ``(keys, rows,
        scores)`` of the live rows whose last holder it was (the caller writes them
        back), or None; their slots are free again."""
        with self._lock:
            slots = staged.slots
            if not slots.numel():
                return None
            self._users[slots] -= 1
            done = slots[(self._users[slots] == 0) & self._live[slots]]
            self._live[slots[self._users[slots] == 0]] = False
            self._reindex()
            if not done.numel():
                return None
            return self._keys[done], self.storage.values[done].clone(), self._scores[done]

    def rows(self, keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Staged rows of keys: ``(rows (n, row_width), found (n,) bool)``; zero rows
        where not staged."""
        with self._lock:
            at = self._find(keys)
            found = at >= 0
            rows = self.storage.values[at.clamp(min=0)].clone()
        rows[~found] = 0
        return rows, found

    def entries(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(keys, rows, scores)`` of every key staged now (copies)."""
        with self._lock:
            at = self._sorted_slots
            return self._keys[at], self.storage.values[at].clone(), self._scores[at]

    def forget(self, keys: torch.Tensor) -> torch.Tensor:
        """Erases keys: their rows stay for the batches holding them but are found no
        more and never written back. Returns (n,) bool, which keys were staged."""
        with self._lock:
            at = self._find(keys)
            found = at >= 0
            self._live[at[found]] = False
            self._reindex()
        return found

    def _find(self, keys: torch.Tensor) -> torch.Tensor:
        """(n,) int64 slots of live keys, -1 elsewhere."""
        n = self._sorted_keys.numel()
        if not n:
            return torch.full_like(keys, -1)
        i = torch.searchsorted(self._sorted_keys, keys).clamp(max=n - 1)
        return torch.where(self._sorted_keys[i] == keys, self._sorted_slots[i], -1)

    def _reindex(self) -> None:
        live = torch.nonzero(self._live, as_tuple=True)[0]
        self._sorted_keys, order = torch.sort(self._keys[live])
        self._sorted_slots = live[order]

    def _claim(self, m: int) -> torch.Tensor:
        """m free slots, growing the storage (same slots, rows copied) when short."""
        free = torch.nonzero(self._users == 0, as_tuple=True)[0]
        if free.numel() < m:
            n = self.storage.num_slots
            grown = TableStorage(self.storage.layout, _buckets(max(2 * n, n + m - free.numel())))
            grown.values[:n] = self.storage.values
            self.storage = grown
            extra = grown.num_slots - n
            self._keys, self._scores, self._users, self._live = (
                torch.cat([t, t.new_zeros((extra, *t.shape[1:]))])
                for t in (self._keys, self._scores, self._users, self._live)
            )
            free = torch.nonzero(self._users == 0, as_tuple=True)[0]
        return free[:m]


def _layout(row_width: int, value_dtype: torch.dtype, device: torch.device) -> TableLayout:
    return TableLayout(
        row_width=row_width, bucket_capacity=_BUCKET, value_dtype=value_dtype,
        keeps_scores=True, keeps_timestamps=False, device=device,
    )  # fmt: skip


def _buckets(rows: int) -> int:
    return max(1, math.ceil(rows / _BUCKET))


__all__ = ["Staged", "StagingArea", "private_table"]
