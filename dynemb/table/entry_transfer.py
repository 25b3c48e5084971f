"""Saved entries out of and into a ScoredHashTable: ``export_batch`` (scans slots) and
``restore`` (stores entries exactly as saved), for checkpoints and exports.

``EntryTransfer`` is a part of ScoredHashTable's API: it reads and changes the table's
TableState (``_state``, table_state.py) only, through the helpers of growth.py.
"""

import torch

from dynemb import _ops
from dynemb.config.types import DynamicEmbScoreStrategy
from dynemb.table import batch_arguments as args
from dynemb.table.batch_stats import BatchStats
from dynemb.table.growth import upsert
from dynemb.table.table_state import TableState


class EntryTransfer:
    """Export and restore of saved entries (a part of ScoredHashTable, over ``_state``)."""

    _state: TableState

    def export_batch(
        self, offset: int, n: int, include_extra: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
        """Exports the live entries of slots ``[offset, offset + n)``.

        Iterating ``offset = 0, next_offset, ...`` until ``next_offset == capacity()``
        visits every live entry exactly once, provided the table does not change
        in between.

        Args:
            offset: first slot, in [0, capacity()].
            n: number of slots to scan (> 0).
            include_extra: also return the extra (optimizer state) columns.

        Returns:
            ``(keys, values, scores, next_offset)``: (m,) int64, (m, dim or dim + extra),
            (m,) int64, and the slot to continue from.
        """
        args.check_int("n", n, 1)
        with self._state.lock.read():
            cap = self.capacity()
            if not isinstance(offset, int) or not 0 <= offset <= cap:
                raise ValueError(f"offset must be an int in [0, capacity()={cap}], got {offset!r}")
            end = min(cap, offset + n)
            s = self._state.storage
            slots = s.occupied(offset, end)
            width = self._state.layout.row_width if include_extra else self.dim
            keys = s.keys[slots]
            values = s.rows(slots, width)
            scores = s.scores[slots] if self._state.layout.keeps_scores else torch.zeros_like(keys)
        return keys, values, scores, end

    def restore(
        self,
        keys: torch.Tensor,
        values: torch.Tensor,
        state: torch.Tensor | None = None,
        scores: torch.Tensor | None = None,
        timestamps: torch.Tensor | None = None,
    ) -> BatchStats:
        """Stores saved entries exactly as a checkpoint holds them, in one pass.

        Each key gets its embedding columns, optimizer state, score and timestamp
        (nothing is re-scored by the strategy); a key already stored is overwritten.
        Placement follows insert_or_assign: the table grows while below capacity,
        then a full bucket evicts its lowest (score, digest, key) resident (CUSTOMIZED refuses
        a newcomer ranking below it), and keys that fit nowhere are reported failed.

        Args:
            keys: (n,) int64, distinct.
            values: (n, dim) contiguous, the table's value dtype.
            state: (n, extra_columns) contiguous optimizer state, or None (a new
                key's extra columns start at ``extra_init``).
            scores: (n,) int64 saved scores (>= 0); required under CUSTOMIZED, refused under
                NO_EVICTION (no score is kept); None keeps the strategy's score.
            timestamps: (n,) int64 last-access times (>= 0), (TIMESTAMP, LFU) tables only.

        Returns:
            The batch's BatchStats (also in ``last_stats``).

        Raises:
            ValueError: a key given twice (naming it and its positions), a negative
                score or timestamp (naming it and its key), or another bad argument;
                nothing is stored then.

        Example::

            >>> t.restore(torch.tensor([5, 9]), torch.zeros(2, t.dim), scores=torch.tensor([3, 1]))
        """
        keys = self._check_keys(keys)
        args.check_distinct("restore", keys)
        n = keys.numel()
        values = args.check_values(values, keys, self.dim, self.dim, self.value_dtype, self.device)
        if state is not None:
            width = self.extra_columns
            state = args.check_values(state, keys, width, width, self.value_dtype, self.device)
        if self._state.strategy == DynamicEmbScoreStrategy.CUSTOMIZED.value and scores is None:
            raise ValueError("restore: `scores` are required under the CUSTOMIZED strategy")
        for name, meta, kept in (
            ("scores", scores, self._state.layout.keeps_scores),
            ("timestamps", timestamps, self._state.layout.keeps_timestamps),
        ):
            if meta is not None and not kept:
                raise ValueError(
                    f"restore: `{name}` given, but a {self.score_strategy} table keeps none"
                )
        scores = args.check_meta("scores", scores, keys, self.device)
        timestamps = args.check_meta("timestamps", timestamps, keys, self.device)
        saved = (values, state, scores, timestamps)

        def op(table, policy, init, k, _scores, _rows, evicted, per_key):
            # per_key: positions in the batch (all of them, or the retried ones).
            sub = saved if per_key.numel() == n else [_subset(t, per_key) for t in saved]
            return _ops.UpsertResult(*_ops.table_restore(table, policy, init, k, *sub, evicted))

        positions = torch.arange(n, device=self.device)
        # `positions` stands in for the row buffer too: op gathers its own inputs.
        # pins=False: the saved keys compete by score (the highest stay), keys of a
        # training batch in flight excepted.
        return upsert(
            self._state, op, keys, None, positions, evicted=None, per_key=positions, pins=False
        )


def _subset(t: torch.Tensor | None, positions: torch.Tensor) -> torch.Tensor | None:
    return None if t is None else t[positions].contiguous()
