"""Row-wise routing of raw int64 keys to their owner rank, and the input dist that does it.

``DynamicEmbTableOptions.dist_type`` picks the rule of a dynamic table:

- ``roundrobin`` (default): ``rank = key mod world_size`` (floored: negative keys too).
- ``hash_roundrobin``: ``rank = fmix64(uint64(key)) mod world_size``, DynamicEmb's rule
  (MurmurHash3's finaliser, unsalted; see hash_routing.py), so patterned ids (e.g. all
  multiples of world_size) spread evenly and a rank's keys spread over all its buckets.
- ``continuous``: blocks of ``ceil(num_embeddings / world_size)`` consecutive ids per
  rank, as TorchRec's row-wise sharding; keys outside ``[0, num_embeddings)`` are not
  dropped, they go to ``key mod world_size`` (what fbgemm's block bucketizer does).

Keys are never rewritten: the owner stores the raw key. The features of an ordinary
table held as a dynamic one (``continuous``) are checked to lie in
``[0, num_embeddings)`` before anything is sent. Ordinary TorchRec tables
sharded row-wise in the same module keep TorchRec's block routing and local row ids.
"""

import torch
import torch.distributed as dist
from torchrec.distributed.embedding_sharding import (
    _fx_wrap_gen_list_n_times,
    _fx_wrap_stride,
    _fx_wrap_stride_per_key_per_rank,
    bucketize_kjt_before_all2all,
)
from torchrec.distributed.sharding.rw_sharding import RwSparseFeaturesDist
from torchrec.distributed.types import Awaitable
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from dynemb.distributed.hash_routing import hash_roundrobin_ranks

DIST_TYPES = ("continuous", "roundrobin", "hash_roundrobin")
STATIC = "static"  # an ordinary TorchRec table: block routing, keys become local rows


def check_dist_type(table: str, dist_type: str) -> None:
    if dist_type not in DIST_TYPES:
        raise ValueError(
            f"table {table!r}: dist_type must be one of {', '.join(DIST_TYPES)}, got {dist_type!r}"
        )


def block_rows(num_embeddings: int, world_size: int) -> int:
    """Ids per rank of the ``continuous`` / ``STATIC`` routing: ``ceil(num_embeddings / world_size)``."""
    return max(1, -(-num_embeddings // world_size))


def continuous_block(num_embeddings: int, world_size: int, rank: int) -> range:
    """The ids in ``[0, num_embeddings)`` that ``continuous`` routing sends to ``rank``."""
    block = block_rows(num_embeddings, world_size)
    return range(min(rank * block, num_embeddings), min((rank + 1) * block, num_embeddings))


def check_ids_in_range(table: str, feature: str, keys: torch.Tensor, num_embeddings: int) -> None:
    """Raises ValueError unless every key of an ordinary table is in ``[0, num_embeddings)``."""
    bad = (keys < 0) | (keys >= num_embeddings)
    if bool(bad.any()):
        first = int(keys[bad][0])
        raise ValueError(
            f"table {table!r} (feature {feature!r}): id {first} is outside "
            f"[0, {num_embeddings}) ({int(bad.sum())} ids of this batch are); an ordinary "
            "table held as a dynamic one (ordinary_tables_as_dynamic) takes the ids of "
            "an ordinary table"
        )


def route_keys(
    keys: torch.Tensor, dist_type: str, world_size: int, num_embeddings: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns ``(rank, value)`` for each key: its owner and what the owner receives.

    ``value`` is the raw key for dynamic tables, the local row for ``STATIC`` tables.
    """
    if dist_type == "roundrobin":
        return torch.remainder(keys, world_size), keys
    if dist_type == "hash_roundrobin":
        return hash_roundrobin_ranks(keys, world_size), keys
    block = block_rows(num_embeddings, world_size)
    in_range = (keys >= 0) & (keys < block * world_size)
    if dist_type == "continuous":
        in_range &= keys < num_embeddings
        rank = torch.where(in_range, torch.div(keys, block, rounding_mode="floor"), 0)
        return torch.where(in_range, rank, torch.remainder(keys, world_size)), keys
    if dist_type == STATIC:  # fbgemm's block_bucketize_sparse_features, key by key
        rank = torch.where(
            in_range,
            torch.div(keys, block, rounding_mode="floor"),
            torch.remainder(keys, world_size),
        )
        local = torch.where(
            in_range, keys - rank * block, torch.div(keys, world_size, rounding_mode="floor")
        )
        return rank, local
    raise ValueError(f"unknown dist_type {dist_type!r}")


def bucketize_by_route(
    sparse_features: KeyedJaggedTensor,
    routes: list[tuple[str, int]],
    num_buckets: int,
    ones: torch.Tensor,
) -> tuple[KeyedJaggedTensor, torch.Tensor]:
    """Splits each feature's keys into ``num_buckets`` buckets by its route
    (``(dist_type, num_embeddings)``, ``route_keys`` over ``num_buckets`` ranks).

    Returns the bucket-major KJT (keys repeated per bucket, as fbgemm's bucketizer
    lays them out: what TorchRec's KJT all-to-all sends) holding the routed values,
    and the permutation that placed each input value.

    ``ones``: ``(len(routes),)`` int64 ones, the bucketizer's block sizes.
    """
    values = sparse_features.values().to(torch.int64)
    ranks = torch.empty_like(values)
    routed = torch.empty_like(values)
    start = 0
    for (dist_type, num_embeddings), n in zip(
        routes, sparse_features.length_per_key(), strict=True
    ):
        rank, value = route_keys(values[start : start + n], dist_type, num_buckets, num_embeddings)
        ranks[start : start + n] = rank
        routed[start : start + n] = value
        start += n
    # fbgemm's bucketizer sorts the values by rank (block size 1 on the rank ids),
    # carrying lengths and weights; its permutation then places the routed keys.
    # It reads lengths and weights as dense arrays, ignoring strides: a KJT built
    # from views (the lengths of one sample, lengths[:, i:i + 1].flatten(), keep
    # a stride) must be made contiguous first.
    weights = sparse_features.weights_or_none()
    by_rank = KeyedJaggedTensor(
        keys=sparse_features.keys(),
        values=ranks,
        weights=weights.contiguous() if weights is not None else None,
        lengths=sparse_features.lengths().contiguous(),
        stride_per_key_per_rank=(
            sparse_features.stride_per_key_per_rank()
            if sparse_features.variable_stride_per_key()
            else None
        ),
        stride=sparse_features.stride(),
    )
    bucketized, permute = bucketize_kjt_before_all2all(
        by_rank, num_buckets=num_buckets, block_sizes=ones, output_permute=True
    )
    keys = torch.empty_like(routed)
    keys[permute] = routed
    features = KeyedJaggedTensor(
        keys=_fx_wrap_gen_list_n_times(sparse_features.keys(), num_buckets),
        values=keys,
        weights=bucketized.weights_or_none(),
        lengths=bucketized.lengths(),
        stride=_fx_wrap_stride(sparse_features),
        stride_per_key_per_rank=_fx_wrap_stride_per_key_per_rank(sparse_features, num_buckets),
    )
    return features, permute


class DynamicEmbRwSparseFeaturesDist(RwSparseFeaturesDist):
    """Routes each key to its owner by its table's rule, then TorchRec's KJT all-to-all.

    Args:
        pg: the sharding process group.
        feature_routes: per feature of this sharding, ``(dist_type, num_embeddings)``
            (dist_type ``STATIC`` for ordinary tables).
        device: where buffers live.
        is_sequence: keep the permutation that restores the input order (EC).
        bounded: per feature, the name of its table when its ids must lie in
            ``[0, num_embeddings)`` (an ordinary table held as a dynamic one), else None;
            the batch is checked before anything is sent.
    """

    def __init__(
        self,
        pg: dist.ProcessGroup,
        feature_routes: list[tuple[str, int]],
        device: torch.device | None = None,
        is_sequence: bool = False,
        bounded: list[str | None] | None = None,
    ) -> None:
        super().__init__(
            pg=pg,
            num_features=len(feature_routes),
            feature_hash_sizes=[max(1, n) for _, n in feature_routes],
            device=device,
            is_sequence=is_sequence,
        )
        self._routes = feature_routes
        self._bounded = bounded or [None] * len(feature_routes)
        self._ones = torch.ones(len(feature_routes), dtype=torch.int64, device=device)

    def forward(
        self, sparse_features: KeyedJaggedTensor
    ) -> Awaitable[Awaitable[KeyedJaggedTensor]]:
        self._check_bounded(sparse_features)
        if self._world_size == 1:  # every key stays here, unchanged (static rows too)
            self.unbucketize_permute_tensor = None
            return self._dist(sparse_features)
        features, permute = bucketize_by_route(
            sparse_features, self._routes, self._world_size, self._ones
        )
        self.unbucketize_permute_tensor = permute if self._is_sequence else None
        return self._dist(features)

    def _check_bounded(self, sparse_features: KeyedJaggedTensor) -> None:
        if not any(self._bounded):
            return
        values = sparse_features.values()
        start = 0
        for feature, table, (_, num_embeddings), n in zip(
            sparse_features.keys(),
            self._bounded,
            self._routes,
            sparse_features.length_per_key(),
            strict=True,
        ):
            if table is not None:
                check_ids_in_range(table, feature, values[start : start + n], num_embeddings)
            start += n
