"""Table-row-wise sharding of dynamic pooled tables: TorchRec's TWRW sharding with our routing and kernels.

A table-row-wise table lives on the ranks of one node (TorchRec's ``local_size``
ranks ``node * local_size ... node * local_size + local_size - 1``, the node of its
plan entry's first rank), row-wise among them: a key is owned by the node's rank
``route_keys(key, dist_type, local_size)`` gives (its table's ``dist_type``, as
row-wise, but over the node's ranks only), and stored there raw. Ranks of other
nodes send their keys for it to that node. What TorchRec gives is kept: its
staggered all-to-all of the bucketized features (each node's tables' features to
that node's ranks, bucket ``b`` to local rank ``b``), and its output dist (a
reduce-scatter of the partial sums inside the node, then an all-to-all across
nodes; with uneven per-rank batches its reduce-scatter runs as an all-to-all,
which gloo does: ``output_dist.py``). Only the bucketization changes: TorchRec's
cuts ids into blocks of ``ceil(num_embeddings / local_size)`` and sends local rows;
ours routes raw keys (``routing.bucketize_by_route``), the ordinary tables of the
same sharding keeping TorchRec's blocks (``STATIC``). MEAN pools as SUM here;
TorchRec's EBC divides after the output dist, as for row-wise.

TorchRec has no table-row-wise sharding for EmbeddingCollection (sequence) tables.
"""

import torch
import torch.distributed as dist
from torchrec.distributed.embedding_sharding import EmbeddingShardingInfo
from torchrec.distributed.sharding.twrw_sharding import (
    TwRwPooledEmbeddingSharding,
    TwRwSparseFeaturesDist,
)
from torchrec.distributed.types import Awaitable, ShardingEnv, ShardingType
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from dynemb.distributed.routing import bucketize_by_route
from dynemb.shard.output_dist import TwRwUnevenPooledEmbeddingDist
from dynemb.shard.rw_sharding import (
    DynamicEmbGroupedPooledEmbeddingsLookup,
    dynamic_options,
    feature_routes,
    is_dynamic,
)
from dynemb.shard.tw_sharding import check_whole_tables


def node_ranks(node: int, local_size: int) -> list[int]:
    """The ranks of ``node`` (TorchRec's layout: ``local_size`` consecutive ranks a node).

    Example::

        node_ranks(1, 2)  # [2, 3]
    """
    return list(range(node * local_size, (node + 1) * local_size))


def check_node_ranks(infos: list[EmbeddingShardingInfo], local_size: int) -> None:
    """Raises ValueError for a dynamic table whose plan entry's ranks are not the
    ranks of one node in order (TorchRec would place it by its first rank alone)."""
    for info in infos:
        ranks = list(info.param_sharding.ranks or [])
        if not is_dynamic(info) or not ranks:
            continue
        want = node_ranks(ranks[0] // local_size, local_size)
        if ranks != want:
            raise ValueError(
                f"table {info.embedding_config.name!r}: a table-row-wise dynamic table "
                f"is held by the {local_size} ranks of one node, got ranks {ranks} "
                f"(expected {want}); plan with dynemb.planner.DynamicEmbeddingShardingPlanner "
                "or torchrec's table_row_wise(host_index)"
            )


class DynamicEmbTwRwSparseFeaturesDist(TwRwSparseFeaturesDist):
    """Routes each key to its owner inside its table's node, then TorchRec's staggered
    KJT all-to-all.

    Args:
        pg: the sharding process group.
        local_size: ranks per node.
        features_per_rank: features each rank receives (its node's tables' features).
        feature_routes: per feature, in the order of the input KJT (node by node),
            ``(dist_type, num_embeddings)`` (``STATIC`` for ordinary tables).
        device: where buffers live.
    """

    def __init__(
        self,
        pg: dist.ProcessGroup,
        local_size: int,
        features_per_rank: list[int],
        feature_routes: list[tuple[str, int]],
        device: torch.device | None = None,
    ) -> None:
        super().__init__(
            pg=pg,
            local_size=local_size,
            features_per_rank=features_per_rank,
            feature_hash_sizes=[max(1, n) for _, n in feature_routes],
            device=device,
        )
        self._routes = feature_routes
        self._ones = torch.ones(len(feature_routes), dtype=torch.int64, device=device)

    def forward(
        self, sparse_features: KeyedJaggedTensor
    ) -> Awaitable[Awaitable[KeyedJaggedTensor]]:
        bucketized, _ = bucketize_by_route(
            sparse_features, self._routes, self._local_size, self._ones
        )
        # TorchRec's order for the all-to-all: node by node, bucket by bucket.
        shuffled = bucketized.permute(self._sf_staggered_shuffle, self._sf_staggered_shuffle_tensor)
        return self._dist(shuffled)


class DynamicEmbTwRwPooledEmbeddingSharding(TwRwPooledEmbeddingSharding):
    """Table-row-wise pooled sharding (EBC) holding dynamic tables."""

    def __init__(self, sharding_infos, env: ShardingEnv, device=None, qcomm_codecs_registry=None):
        check_whole_tables(sharding_infos)
        self._dynamic_options = dynamic_options(sharding_infos)
        super().__init__(sharding_infos, env, device, qcomm_codecs_registry=qcomm_codecs_registry)
        check_node_ranks(sharding_infos, self._local_size)

    def create_input_dist(self, device: torch.device | None = None):
        routes = [
            route
            for configs in self._grouped_embedding_configs_per_node
            for route in feature_routes(configs, self._dynamic_options)
        ]
        return DynamicEmbTwRwSparseFeaturesDist(
            pg=self._pg,
            local_size=self._local_size,
            features_per_rank=self._features_per_rank(self._grouped_embedding_configs_per_rank),
            feature_routes=routes,
            device=device if device is not None else self._device,
        )

    def create_output_dist(self, device: torch.device | None = None):
        return TwRwUnevenPooledEmbeddingDist(
            rank=self._rank,
            cross_pg=self._cross_pg,
            intra_pg=self._intra_pg,
            dim_sum_per_node=self._dim_sum_per_node(),
            emb_dim_per_node_per_feature=self._emb_dim_per_node_per_feature(),
            device=device if device is not None else self._device,
            qcomm_codecs_registry=self.qcomm_codecs_registry,
        )

    def create_lookup(self, device=None, fused_params=None, feature_processor=None):
        return DynamicEmbGroupedPooledEmbeddingsLookup(
            self._dynamic_options,
            {},
            grouped_configs=self._grouped_embedding_configs_per_rank[self._rank],
            pg=self._pg,
            device=device if device is not None else self._device,
            feature_processor=feature_processor,
            sharding_type=ShardingType.TABLE_ROW_WISE,
            env=self._env,
        )


__all__ = [
    "DynamicEmbTwRwPooledEmbeddingSharding",
    "DynamicEmbTwRwSparseFeaturesDist",
    "check_node_ranks",
    "node_ranks",
]
