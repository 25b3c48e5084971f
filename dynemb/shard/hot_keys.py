"""Hot keys of a row-wise dynamic table, copied to every rank (``hot_replicas=K``).

A table scored by access counts (LFU or DECAYED_LFU, alone or in a compound) ranks its
keys by the scores its owners keep: each rank's K best owned keys are candidates.
Otherwise each rank counts the ids of its own batches (at most ``SAMPLE_IDS`` a batch
and table, evenly strided; a window's counts, truncated to its ``4 K`` most frequent:
a small sketch). Every ``hot_refresh_steps`` training steps all ranks choose, in
lockstep, the same hot set from every rank's candidates: the K keys of most accesses
(scores, or window counts summed over the ranks), ties broken by the smaller key,
among those their owner holds. The
owner's whole rows (weights and optimizer state) and scores are then copied into a
small replica on every rank: a one-table ``BatchedDynamicEmbeddingTables`` with the
owner's options and optimizer, so that an update of a replica row runs the very
kernel that updates the owner's row. Keys that leave the set are dropped from the
replicas (the owner's row is the table's all along: checkpoints, dumps, deltas and
eviction read it).

A training step then (``hot_dist.py``): the hot ids of a batch are looked up in the
local replica, not sent; their gradients are summed per key on each rank, summed
over the ranks (an all-reduce of the hot keys' access counts, then one of the rows
some rank touched, in hot-set order), and the same update (same row,
same state, same summed gradient, same step) is applied to every replica and to the
owner's row, so that every copy holds the same bits.
"""

import dataclasses

import torch
import torch.distributed as dist

from dynemb.config.score_strategies import evict_strategy_of
from dynemb.config.table_options import hot_replica_rows
from dynemb.config.types import DynamicEmbCheckMode, DynamicEmbEvictStrategy, DynamicEmbPoolingMode
from dynemb.distributed.routing import route_keys
from dynemb.tbe.batched_dynamic_embedding_tables import BatchedDynamicEmbeddingTables

_SKETCH_FACTOR = 4  # a rank keeps the counts of its 4 K most frequent keys of a window
SAMPLE_IDS = 8192  # ids of a batch and table counted at most (an even sample)


def top_keys(keys: torch.Tensor, counts: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``k`` keys of most ``counts`` (distinct ``keys``), ties broken by the smaller
    key: ``(keys, counts)`` in that order. Deterministic: every rank gets the same."""
    order = torch.argsort(keys)
    keys, counts = keys[order], counts[order]
    order = torch.sort(counts, descending=True, stable=True).indices[:k]
    return keys[order], counts[order]


def merge_counts(keys: torch.Tensor, counts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Sums the counts of equal keys: ``(distinct keys ascending, their counts)``."""
    distinct, inverse = torch.unique(keys, return_inverse=True)
    summed = torch.zeros(distinct.numel(), dtype=torch.int64, device=keys.device)
    return distinct, summed.index_add_(0, inverse, counts.to(torch.int64))


class AccessSketch:
    """One rank's access counts of a table's keys over a window, the ``limit`` most
    frequent kept (ties: smaller keys)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.keys = torch.zeros(0, dtype=torch.int64)
        self.counts = torch.zeros(0, dtype=torch.int64)

    def add(self, ids: torch.Tensor, counts: torch.Tensor | None = None) -> None:
        """Counts ``ids``: every one of a small batch, else an evenly strided sample of
        ``SAMPLE_IDS`` of them (a hot key is hot in any sample; counting all of
        W-train's 65k ids a table and step cost as much as the rest of the hot path)."""
        if ids.numel() == 0:
            return
        stride = max(1, ids.numel() // SAMPLE_IDS)
        ids = ids[::stride].to("cpu", torch.int64)
        if counts is None:
            counts = torch.ones(ids.numel(), dtype=torch.int64)
        else:  # per-id access counts (a de-duplicated batch's weights)
            counts = counts[::stride].to("cpu").round().to(torch.int64)
        keys, counts = merge_counts(torch.cat([self.keys, ids]), torch.cat([self.counts, counts]))
        if keys.numel() > self.limit:
            keys, counts = top_keys(keys, counts, self.limit)
        self.keys, self.counts = keys, counts

    def take(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The window's counts; the next window starts empty."""
        window = (self.keys, self.counts)
        self.keys, self.counts = self.keys[:0], self.counts[:0]
        return window


def _replica_options(options, capacity: int):
    """The owner's options for a replica of ``capacity`` rows in memory: no admission,
    warm start, caching, spill or eviction rule (its rows come from the owner)."""
    return dataclasses.replace(
        options,
        max_capacity=capacity,
        init_capacity=capacity,
        caching=False,
        external_storage=None,
        local_hbm_for_values=0,
        global_hbm_for_values=0,
        admit_strategy=None,
        admission_counter=None,
        warm_start=None,
        eviction_rule=None,
        spill_directory=None,
        safe_check_mode=DynamicEmbCheckMode.ERROR,
        hot_replicas=0,
    )


class HotTable:
    """The hot set of one table on this rank: its keys (ascending: a key's position in
    it orders the all-reduce), the replica, and the owner's group of tables.

    Args:
        name: the table's name.
        k: ``hot_replicas``.
        group: this rank's ``BatchedDynamicEmbeddingTables`` holding the table.
        pg: the sharding's process group.
    """

    def __init__(self, name: str, k: int, group: BatchedDynamicEmbeddingTables, pg) -> None:
        self.name = name
        self.k = k
        self.group = group
        self.pg = pg
        self.world_size = dist.get_world_size(pg)
        self.rank = dist.get_rank(pg)
        self.t = group.table_names.index(name)
        self.feature = group.feature_table_map.index(self.t)  # the table's first feature
        self.dim = group.dims[self.t]
        options = group.table_options[self.t]
        # LFU / DECAYED_LFU scores rank keys by accesses (the owner's, all ranks'
        # counted: the hot keys' updates pass their counts); no sketch is kept then
        self.by_scores = evict_strategy_of(options.score_strategy) == DynamicEmbEvictStrategy.LFU
        self.sketch = AccessSketch(_SKETCH_FACTOR * k)
        self.keys = torch.zeros(0, dtype=torch.int64, device=group.device)
        config = group.optimizer_config
        self.replica = BatchedDynamicEmbeddingTables(
            [_replica_options(options, hot_replica_rows(options))],
            [0],
            pooling_mode=group.pooling_mode,
            table_names=[name],
            device=group.device,
            **{f.name: getattr(config, f.name) for f in dataclasses.fields(config)},
        )
        self._rows: torch.Tensor | None = None  # the replica's rows, float32, until an update
        # what a hot-set choice moved, for telemetry and tests
        self.promoted = 0
        self.demoted = 0

    # ------------------------------------------------------------ the hot set

    def positions(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(hot mask, position in the hot set (valid where hot))`` of ``ids``."""
        if self.keys.numel() == 0:
            return torch.zeros_like(ids, dtype=torch.bool), torch.zeros_like(ids)
        at = torch.searchsorted(self.keys, ids).clamp_(max=self.keys.numel() - 1)
        return self.keys[at] == ids, at

    def owners(self, keys: torch.Tensor) -> torch.Tensor:
        dist_type, num_embeddings = self.group.table_routing(self.t)
        return route_keys(keys, dist_type, self.world_size, num_embeddings)[0]

    def count(self, ids: torch.Tensor, counts: torch.Tensor | None = None) -> None:
        """Counts a training batch's ids of the table, ``counts`` accesses each (default
        1), unless the table ranks by its scores."""
        if not self.by_scores:
            self.sketch.add(ids, counts)

    def candidates(self) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's candidates and their counts: the K owned keys of best scores
        (a table scored by accesses), else the window's counts (ends the window)."""
        if self.by_scores:
            return self.best_scored()
        return self.sketch.take()

    def best_scored(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The K keys of highest score in this rank's table, ties to the smaller key:
        with each key held by one owner, the K best of every rank's K best are the
        table's. Reads the keys and scores of the stored slots only (not their rows:
        copying those cost 1 s a table of 500k rows)."""
        table = self.group.tables[self.t]
        with table.lock.read():
            storage = table.buffers
            slots = storage.occupied(0, storage.num_slots)
            keys, scores = storage.keys[slots], storage.scores[slots]
        keys, scores = keys.to("cpu", torch.int64), scores.to("cpu", torch.int64)
        if keys.numel() > self.k:  # the K-th best score, ties to it kept for top_keys
            kept = scores >= torch.topk(scores, self.k).values[-1]
            keys, scores = keys[kept], scores[kept]
        return top_keys(keys, scores, self.k)

    def choose(self, gathered: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        """The K keys of most accesses over every rank's window (same on every rank)."""
        keys = torch.cat([k for k, _ in gathered])
        counts = torch.cat([c for _, c in gathered])
        keys, counts = merge_counts(keys, counts)
        return top_keys(keys, counts, self.k)[0]

    def owned_entries(self, candidates: torch.Tensor) -> dict:
        """The owner's whole rows and scores of the candidates this rank owns."""
        mine = torch.nonzero(self.owners(candidates) == self.rank, as_tuple=True)[0]
        table = self.group.tables[self.t]
        rows, scores, found = table.find_entries(candidates[mine].to(self.group.device))
        return {"at": mine[found.cpu()], "rows": rows[found].cpu(), "scores": scores[found].cpu()}

    def install(self, candidates: torch.Tensor, gathered: list[dict]) -> None:
        """Makes the candidates the owners hold the hot set, with the owners' entries."""
        at = torch.cat([g["at"] for g in gathered])
        rows = torch.cat([g["rows"] for g in gathered])
        scores = torch.cat([g["scores"] for g in gathered])
        keys = candidates[at]
        order = torch.argsort(keys)
        keys, rows, scores = keys[order], rows[order], scores[order]
        old = set(self.keys.tolist())
        new = set(keys.tolist())
        self.promoted += len(new - old)
        self.demoted += len(old - new)
        store = self.replica.tables[0]
        self._rows = None
        store.clear()
        device = self.group.device
        if keys.numel():
            lost = store.write_back(keys.to(device), rows.to(device), scores.to(device))[0]
            if lost.numel():  # never at a quarter full: reported rather than wrong
                raise RuntimeError(
                    f"table {self.name!r}: {lost.numel()} hot keys did not fit the replica"
                )
        self.keys = keys.to(device)

    def replica_rows(self) -> torch.Tensor:
        """The replica's whole rows (weights and optimizer state) of the hot set, in order."""
        return self.replica.tables[0].find_entries(self.keys)[0]

    # ------------------------------------------------------------ a step

    def rows(self) -> torch.Tensor:
        """The replica's rows of the hot set, in order, float32: read once per update
        (a batch holds many more hot ids than hot keys)."""
        if self._rows is None:
            rows, found = self.replica.tables[0].find(self.keys)
            if not bool(found.all()):
                raise RuntimeError(f"table {self.name!r}: a hot key is missing from its replica")
            self._rows = rows.to(torch.float32)
        return self._rows

    def update(self, grads: torch.Tensor, counts: torch.Tensor, step: int) -> None:
        """Applies the step's summed gradients ``grads`` ((h, dim), all ranks') of the
        hot keys with ``counts`` > 0 (their accesses over all ranks) to the replica and,
        for the keys this rank owns, to the owner's row: the same fused update."""
        touched = torch.nonzero(counts > 0, as_tuple=True)[0]
        if touched.numel() == 0:
            return
        keys = self.keys[touched]
        grads, counts = grads[touched], counts[touched].to(torch.int64)
        self._rows = None
        self.replica.set_learning_rate(self.group.get_learning_rate())
        _apply(self.replica, 0, keys, grads, counts, step)
        mine = self.owners(keys) == self.rank
        if bool(mine.any()):
            _apply(self.group, self.feature, keys[mine], grads[mine], counts[mine], step)


def _apply(tables: BatchedDynamicEmbeddingTables, feature, keys, grads, counts, step) -> None:
    """One fused update of ``keys`` of ``tables`` by ``grads``, as the ``step + 1``-th
    update (the step of the training step's own backward, whichever runs first): a
    training forward of one bag per key on ``feature`` (``counts`` as access counts,
    which LFU scores count), then its backward. The table's score clock is set back so
    that this lookup scores as the step's own lookup did (STEP, DECAYED_LFU)."""
    n, features = keys.numel(), len(tables.feature_table_map)
    lengths = torch.zeros(features, n, dtype=torch.int64, device=tables.device)
    lengths[feature] = 1
    offsets = torch.cat([lengths.new_zeros(1), lengths.flatten().cumsum(0)])
    store = tables.tables[tables.feature_table_map[feature]]
    saved_step, was_training, clock = tables.step, tables.training, store.score_step
    tables.train(True)
    store.score_step = max(0, clock - 1)
    try:
        with torch.enable_grad():
            out = tables(keys, offsets, access_counts=counts)
            if tables.pooling_mode == DynamicEmbPoolingMode.NONE:  # a row per key
                grad = grads.to(out.dtype)
            else:
                grad = torch.zeros_like(out)
                column = sum(tables.feature_dims[:feature])
                grad[:, column : column + grads.shape[1]] = grads
            tables.step = step
            torch.autograd.backward(out, grad)
    finally:
        tables.step = saved_step
        store.score_step = clock
        tables.train(was_training)


__all__ = ["AccessSketch", "HotTable", "merge_counts", "top_keys"]
