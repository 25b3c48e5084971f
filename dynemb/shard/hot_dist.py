"""The hot keys of a row-wise sharding in a training step (see ``hot_keys.py``).

The input dist splits each batch: the ids in their table's hot set stay here (their
positions are kept for the output), the others go through the all-to-all as before.
The output dist adds, to what comes back, the hot ids' rows read from the local
replica: pooled into their bags (EBC: MEAN divides the sum by the whole bag's length
afterwards, as for the rows that came back), or put at their positions (EC). Its
backward sums the gradients of each hot key on this rank, sums them over the ranks
(all-reduces of the access counts, then of the touched keys' gradients, in hot-set
order: the same bits on every rank), then applies the same
update to every replica and to the owners' rows (``HotTable.update``).

Each input dist of a step hands its split to the output dist of the same step
(first in, first out: one input dist per output dist, in order, as in TorchRec's
pipelines); the hot sets are chosen again at a step boundary, when no step's
backward is pending, every rank in lockstep.
"""

import collections
import dataclasses

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torchrec.distributed.comm_ops import get_gradient_division
from torchrec.distributed.sharding.rw_sequence_sharding import RwSequenceEmbeddingDist
from torchrec.distributed.types import Awaitable
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from dynemb.distributed.routing import DynamicEmbRwSparseFeaturesDist
from dynemb.shard.hot_keys import HotTable
from dynemb.shard.output_dist import RwUnevenPooledEmbeddingDist
from dynemb.table_groups import table_groups


@dataclasses.dataclass
class HotSplit:
    """The hot ids of one batch: per hot id, its feature, sample, position in its
    table's hot set, weight, and place in the batch's values; the cold values' places."""

    feature: torch.Tensor
    sample: torch.Tensor
    position: torch.Tensor
    weights: torch.Tensor | None
    index: torch.Tensor
    cold_index: torch.Tensor
    total: int
    steps: dict  # table -> its group's optimizer step at the forward
    training: bool  # a training batch: its backward updates the hot keys


class HotSharding:
    """The hot tables of one row-wise sharding.

    Args:
        feature_tables: per feature of the sharding, in order, its table's name.
        options: table name -> DynamicEmbTableOptions of the dynamic tables.
        feature_dims: per feature, its output width.
        pg: the sharding's process group.
    """

    def __init__(self, feature_tables: list[str], options: dict, feature_dims: list[int], pg):
        self.pg = pg
        self.world_size = dist.get_world_size(pg)
        self.k = {
            name: o.hot_replicas
            for name, o in options.items()
            if o.hot_replicas > 0 and name in feature_tables
        }
        self.refresh = {name: options[name].hot_refresh_steps for name in self.k}
        for name in self.k:
            if options[name].caching:
                raise ValueError(
                    f"table {name!r}: hot_replicas is not supported with caching=True "
                    "(the replicas copy the owner's rows from its table in memory)"
                )
        self.feature_tables = feature_tables
        self.columns = [sum(feature_dims[:f]) for f in range(len(feature_dims))]
        self.feature_dims = feature_dims
        self.tables: dict[str, HotTable] = {}
        self._splits: collections.deque = collections.deque()
        self._since: dict[str, int] = dict.fromkeys(self.k, 0)
        # the features' weights are per-id access counts (EC with use_index_dedup sends
        # each distinct id once, its count as its weight): hot keys count them
        self.counts_in_weights = False
        self.pending = 0  # training forwards whose backward has not run
        self.local_ids = 0  # ids served from the replicas (this rank's batches)
        self.sent_ids = 0  # ids of hot tables sent through the all-to-all

    @staticmethod
    def wanted(options: dict, pg) -> bool:
        return dist.get_world_size(pg) > 1 and any(o.hot_replicas > 0 for o in options.values())

    def bind(self, lookup) -> None:
        """Finds the groups of the hot tables in the sharding's lookup."""
        for _, group in table_groups(lookup):
            for name in group.table_names:
                if name in self.k:
                    self.tables[name] = HotTable(name, self.k[name], group, self.pg)
        missing = set(self.k) - set(self.tables)
        if missing:
            raise RuntimeError(f"tables {sorted(missing)}: no dynamic kernel holds them here")

    def _hot_of(self, f: int) -> HotTable | None:
        return self.tables.get(self.feature_tables[f])

    def _active(self) -> bool:
        return any(t.keys.numel() for t in self.tables.values())

    # ------------------------------------------------------------ input side

    def before_batch(self, features: KeyedJaggedTensor, training: bool) -> None:
        """Counts a training batch's ids; chooses the hot sets due, at a step boundary."""
        if not training or not self.tables:
            return
        values, start = features.values(), 0
        counts = features.weights_or_none() if self.counts_in_weights else None
        for f, n in enumerate(features.length_per_key()):
            hot = self._hot_of(f)
            if hot is not None:
                hot.count(
                    values[start : start + n], None if counts is None else counts[start : start + n]
                )
            start += n
        for name in self._since:
            self._since[name] += 1
        due = sorted(n for n, s in self._since.items() if s > self.refresh[n])
        if due and self.pending == 0:
            self.choose(due)

    def choose(self, names: list[str]) -> None:
        """Chooses the hot sets of ``names`` again (a collective of the sharding's ranks)."""
        mine = {n: self.tables[n].candidates() for n in names}
        gathered = [None] * self.world_size
        dist.all_gather_object(gathered, mine, group=self.pg)
        chosen = {n: self.tables[n].choose([g[n] for g in gathered]) for n in names}
        entries = {n: self.tables[n].owned_entries(chosen[n]) for n in names}
        gathered = [None] * self.world_size
        dist.all_gather_object(gathered, entries, group=self.pg)
        for n in names:
            self.tables[n].install(chosen[n], [g[n] for g in gathered])
            self._since[n] = 1

    def reload(self) -> None:
        """Copies the owners' entries of the current hot sets into the replicas again
        (a collective of the sharding's ranks): after the owners' rows were rewritten
        outside training, e.g. by a checkpoint load."""
        names = sorted(self.tables)
        entries = {n: self.tables[n].owned_entries(self.tables[n].keys.cpu()) for n in names}
        gathered = [None] * self.world_size
        dist.all_gather_object(gathered, entries, group=self.pg)
        for n in names:
            table = self.tables[n]
            promoted, demoted = table.promoted, table.demoted
            table.install(table.keys.cpu(), [g[n] for g in gathered])
            table.promoted, table.demoted = promoted, demoted

    def split(self, features: KeyedJaggedTensor, training: bool) -> KeyedJaggedTensor:
        """The cold part of ``features`` (same keys and bags); the hot part is kept
        for the output dist of this batch."""
        if not self._active():
            self._splits.append(None)
            return features
        if features.variable_stride_per_key():
            raise ValueError("hot_replicas: batches of variable size per feature are not supported")
        values, lengths = features.values(), features.lengths()
        hot_mask = torch.zeros(values.numel(), dtype=torch.bool, device=values.device)
        position = torch.zeros(values.numel(), dtype=torch.int64, device=values.device)
        start = 0
        for f, n in enumerate(features.length_per_key()):
            hot = self._hot_of(f)
            if hot is not None and n:
                mask, at = hot.positions(values[start : start + n].to(torch.int64))
                hot_mask[start : start + n] = mask
                position[start : start + n] = at
                self.sent_ids += n - int(mask.sum())
            start += n
        index = torch.nonzero(hot_mask, as_tuple=True)[0]
        cold_index = torch.nonzero(~hot_mask, as_tuple=True)[0]
        stride = features.stride()
        bags = lengths.numel()
        bag = torch.repeat_interleave(
            torch.arange(bags, device=values.device), lengths.to(torch.int64)
        )[index]
        weights = features.weights_or_none()
        steps = {n: t.group.step for n, t in self.tables.items()}
        self._splits.append(
            HotSplit(
                feature=torch.div(bag, max(stride, 1), rounding_mode="floor"),
                sample=bag % max(stride, 1),
                position=position[index],
                weights=weights[index] if weights is not None else None,
                index=index,
                cold_index=cold_index,
                total=values.numel(),
                steps=steps,
                training=training,
            )
        )
        self.local_ids += index.numel()
        if index.numel() == 0:
            return features
        cold_lengths = lengths - torch.bincount(bag, minlength=bags).to(lengths.dtype)
        return KeyedJaggedTensor(
            keys=features.keys(),
            values=values[cold_index],
            weights=weights[cold_index] if weights is not None else None,
            lengths=cold_lengths,
            stride=stride,
        )

    def pop(self) -> HotSplit | None:
        if not self._splits:
            raise RuntimeError(
                "hot_replicas: an output dist without its input dist (one input dist "
                "per output dist, in order)"
            )
        return self._splits.popleft()

    # ------------------------------------------------------------ output side

    def hot_features(self) -> list[tuple[int, HotTable]]:
        return [(f, t) for f in range(len(self.feature_tables)) if (t := self._hot_of(f))]

    def reduce_and_update(self, split: HotSplit, local: dict) -> None:
        """Sums each hot key's gradient over the ranks, and applies the update to the
        replicas and the owners' rows.

        Two all-reduces in hot-set order (the same bits on every rank): the access
        counts of every hot key, then the gradients of the keys some rank touched.
        ``local``: table -> (this rank's gradient sums (K, dim), access counts (K,))."""
        names = sorted(self.tables)
        device = self.tables[names[0]].group.device  # where the collectives run (NCCL: cuda)
        sums, counts = {}, {}
        for n, t in self.tables.items():
            sums[n] = torch.zeros(t.keys.numel(), t.dim, device=device)
            counts[n] = torch.zeros(t.keys.numel(), device=device)
        for n, (g, c) in local.items():
            sums[n] += g.to(device, torch.float32)
            counts[n] += c.to(device, torch.float32)
        flat = torch.cat([counts[n] for n in names])
        dist.all_reduce(flat, group=self.pg)  # float32: exact up to 2**24 accesses
        touched, start = {}, 0
        for n in names:
            size = self.tables[n].keys.numel()
            counts[n] = flat[start : start + size]
            touched[n] = torch.nonzero(counts[n] > 0, as_tuple=True)[0]
            start += size
        rows = torch.cat([sums[n][touched[n]].flatten() for n in names])
        dist.all_reduce(rows, group=self.pg)
        scale = 1.0 / self.world_size if get_gradient_division() else 1.0
        start = 0
        for n in names:
            table = self.tables[n]
            size = touched[n].numel() * table.dim
            grads = torch.zeros(table.keys.numel(), table.dim, device=device)
            grads[touched[n]] = rows[start : start + size].view(-1, table.dim)
            start += size
            if scale != 1.0:
                grads = grads * scale
            table.update(grads, counts[n], split.steps[n])


def _key_sums(k: int, positions, offsets, grad, weights) -> torch.Tensor:
    """(k, dim): the gradient of each hot key, summed over its ids (``positions`` in
    the hot set, bags at ``offsets``, ``grad`` per bag): an embedding bag's weight
    gradient (a fast dense kernel rather than an index_add of every id's row)."""
    weight = torch.zeros(k, grad.shape[1], dtype=grad.dtype, device=grad.device)
    weight.requires_grad_(True)
    with torch.enable_grad():
        out = F.embedding_bag(positions, weight, offsets, mode="sum", per_sample_weights=weights)
        return torch.autograd.grad(out, weight, grad)[0]


def _bag_offsets(samples: torch.Tensor, batch: int) -> torch.Tensor:
    """Start of each sample's bag in ``samples`` (ascending sample of each id)."""
    counts = torch.bincount(samples, minlength=batch)
    return torch.cat([counts.new_zeros(1), counts.cumsum(0)[:-1]])


class _HotPooled(torch.autograd.Function):
    """``cold + the hot ids' rows pooled into their bags``; backward: the hot keys'
    update, and the cold part's gradient unchanged."""

    @staticmethod
    def forward(ctx, cold, hot: HotSharding, split: HotSplit, trains: bool):
        out = cold.clone()
        parts = []
        for f, table in hot.hot_features():
            mask = split.feature == f
            if not bool(mask.any()):
                continue
            # ids of one feature come sample by sample: bags by offsets
            positions = split.position[mask]
            offsets = _bag_offsets(split.sample[mask], out.shape[0])
            weights = None if split.weights is None else split.weights[mask].to(torch.float32)
            pooled = F.embedding_bag(
                positions, table.rows(), offsets, mode="sum", per_sample_weights=weights
            )
            c = hot.columns[f]
            out[:, c : c + table.dim] += pooled.to(out.dtype)
            parts.append((table, positions, offsets, weights, c))
        ctx.hot, ctx.split, ctx.parts = hot, split, parts
        # grad mode is off inside forward: the caller's was read before apply
        ctx.trains = trains
        if trains:
            hot.pending += 1
        return out

    @staticmethod
    def backward(ctx, grad):
        hot, split = ctx.hot, ctx.split
        if not ctx.trains:  # an eval forward's backward updates nothing, as the kernel's
            return grad, None, None, None
        local = {}
        for table, positions, offsets, weights, c in ctx.parts:
            k = table.keys.numel()
            g = grad[:, c : c + table.dim].to(torch.float32)
            sums = _key_sums(k, positions, offsets, g, weights)
            counts = torch.bincount(positions, minlength=k)
            if table.name in local:  # another feature of the same table
                sums, counts = sums + local[table.name][0], counts + local[table.name][1]
            local[table.name] = (sums, counts)
        try:
            hot.reduce_and_update(split, local)
        finally:
            hot.pending -= 1
        return grad, None, None, None


class _HotSequence(torch.autograd.Function):
    """The batch's rows in input order: the cold rows that came back, and the hot ids'
    rows from the replicas; backward: the hot keys' update, the cold rows' gradient."""

    @staticmethod
    def forward(ctx, cold, hot: HotSharding, split: HotSplit, trains: bool):
        out = cold.new_empty((split.total, cold.shape[1]))
        out[split.cold_index] = cold
        parts = []
        for f, table in hot.hot_features():
            mask = split.feature == f
            if bool(mask.any()):
                positions = split.position[mask]
                out[split.index[mask]] = table.rows()[positions].to(out)
                accesses = None
                if hot.counts_in_weights and split.weights is not None:
                    accesses = split.weights[mask].round().to(torch.int64)
                parts.append((table, positions, split.index[mask], accesses))
        ctx.hot, ctx.split, ctx.parts = hot, split, parts
        ctx.trains = trains
        if trains:
            hot.pending += 1
        return out

    @staticmethod
    def backward(ctx, grad):
        hot, split = ctx.hot, ctx.split
        if not ctx.trains:
            return grad[split.cold_index], None, None, None
        local = {}
        for table, positions, index, accesses in ctx.parts:
            k = table.keys.numel()
            offsets = torch.arange(positions.numel(), device=positions.device)
            sums = _key_sums(k, positions, offsets, grad[index].to(torch.float32), None)
            if accesses is None:
                counts = torch.bincount(positions, minlength=k)
            else:  # a de-duplicated batch: each id's occurrences
                counts = torch.zeros(k, dtype=torch.int64, device=positions.device)
                counts.index_add_(0, positions, accesses)
            if table.name in local:
                sums, counts = sums + local[table.name][0], counts + local[table.name][1]
            local[table.name] = (sums, counts)
        try:
            hot.reduce_and_update(split, local)
        finally:
            hot.pending -= 1
        return grad[split.cold_index], None, None, None


def _trains(split: HotSplit) -> bool:
    """Whether the backward of this batch's hot rows is to update them."""
    return torch.is_grad_enabled() and split.training


class _Then(Awaitable):
    """``fn`` of what ``inner`` waits for."""

    def __init__(self, inner: Awaitable, fn) -> None:
        super().__init__()
        self._inner, self._fn = inner, fn

    def _wait_impl(self):
        return self._fn(self._inner.wait())


class HotRwSparseFeaturesDist(DynamicEmbRwSparseFeaturesDist):
    """The row-wise input dist that keeps the hot ids here and sends the others."""

    def __init__(self, hot: HotSharding, **kwargs) -> None:
        super().__init__(**kwargs)
        self.hot_sharding = hot

    def forward(self, sparse_features: KeyedJaggedTensor):
        self.hot_sharding.before_batch(sparse_features, self.training)
        return super().forward(self.hot_sharding.split(sparse_features, self.training))


class HotRwPooledEmbeddingDist(RwUnevenPooledEmbeddingDist):
    """The row-wise pooled output dist, plus the hot ids' bags."""

    def __init__(self, hot: HotSharding, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._hot = hot

    def forward(self, local_embs: torch.Tensor, sharding_ctx=None) -> Awaitable[torch.Tensor]:
        split, hot = self._hot.pop(), self._hot
        awaitable = super().forward(local_embs, sharding_ctx)
        if split is None:
            return awaitable
        return _Then(awaitable, lambda out: _HotPooled.apply(out, hot, split, _trains(split)))


class HotRwSequenceEmbeddingDist(RwSequenceEmbeddingDist):
    """The row-wise sequence output dist, plus the hot ids' rows."""

    def __init__(self, hot: HotSharding, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._hot = hot

    def forward(self, local_embs: torch.Tensor, sharding_ctx=None) -> Awaitable[torch.Tensor]:
        split, hot = self._hot.pop(), self._hot
        awaitable = super().forward(local_embs, sharding_ctx)
        if split is None:
            return awaitable
        return _Then(awaitable, lambda rows: _HotSequence.apply(rows, hot, split, _trains(split)))


def hot_tables(model: torch.nn.Module) -> dict[str, HotTable]:
    """Table name -> its ``HotTable`` (hot set, replica) on this rank, over ``model``."""
    found = {}
    for hot in _shardings(model):
        found.update(hot.tables)
    return found


def _shardings(model: torch.nn.Module) -> list[HotSharding]:
    # the sharded modules' hook: TorchRec keeps their input dists out of modules()' reach
    return [h for m in model.modules() if hasattr(m, "hot_shardings") for h in m.hot_shardings()]


def reload_hot_replicas(model: torch.nn.Module) -> None:
    """Copies the owners' rows, optimizer state and scores of the current hot keys into
    every rank's replicas again: call it on every rank after loading rows into a model
    that has trained with ``hot_replicas`` (a load writes the owners' rows only)."""
    for hot in _shardings(model):
        hot.reload()


def hot_key_stats(model: torch.nn.Module) -> dict[str, int]:
    """This rank's counts of the hot keys of ``model``'s row-wise dynamic tables:
    ``local_ids`` (ids of its batches served from the replicas), ``sent_ids`` (ids of
    tables with ``hot_replicas`` sent through the all-to-all), ``hot_keys`` (keys in
    the hot sets now), ``promoted`` / ``demoted`` (keys that entered / left them)."""
    stats = dict.fromkeys(("local_ids", "sent_ids", "hot_keys", "promoted", "demoted"), 0)
    for hot in _shardings(model):
        stats["local_ids"] += hot.local_ids
        stats["sent_ids"] += hot.sent_ids
        for table in hot.tables.values():
            stats["hot_keys"] += table.keys.numel()
            stats["promoted"] += table.promoted
            stats["demoted"] += table.demoted
    return stats


__all__ = [
    "HotRwPooledEmbeddingDist",
    "HotRwSequenceEmbeddingDist",
    "HotRwSparseFeaturesDist",
    "HotSharding",
    "HotSplit",
    "hot_key_stats",
    "hot_tables",
    "reload_hot_replicas",
]
