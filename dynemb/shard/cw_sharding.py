"""Column-wise sharding of dynamic tables (pooled and sequence): TorchRec's CW sharding with our kernels.

A column-wise table is cut into column slices, one per rank of its plan entry; each of
those ranks holds a dynamic table of its slice's width. TorchRec's input dist sends
every feature of the table, ids untouched, to every one of those ranks, and its output
dist puts the slices' pooled columns side by side.

Why the slices never disagree about which keys are stored: a slice's table runs the
same deterministic algorithm as every other slice (``csrc/core``) on the same input:
every slice receives the same ids in the same order (the global batch of the table's
features, gathered in rank order by TorchRec's all-to-all), its table has the same
capacity, buckets, hash and score strategy (the options differ in ``dim`` and
``column_offset`` only), and its scores are made of the batch's keys and the table's own step
(STEP, LFU) or of the batch's timestamp, which a slice reads once per batch. So each
batch inserts, scores and evicts the same keys into the same slots of every slice; the
key placement never depends on the row width. (TIMESTAMP scores are the time each
rank's batch ran, so they differ between slices by a few microseconds; the order of
keys within a rank, which decides evictions, is the same as long as the ranks' clocks
do not run backwards between batches: all keys of one batch share one time.) Slices
made to disagree from outside (a key erased on one rank only) are reported by the
safe-check modes (slice_agreement.py).

A slice's new rows are its columns of the rows the unsharded table would give
(``DynamicEmbTableOptions.column_offset``, core/initializer.h): the slices side by side
start as the whole table does, and with an element-wise optimizer (SGD, Adam) they
stay equal to it. Optimizer state is per slice, as in TorchRec: row-wise Adagrad's row
state is the mean of the squared gradient over the slice's columns (TorchRec keeps one
per shard too), so under it a slice trains as a table of its own width would.
"""

import dataclasses

from torchrec.distributed.embedding_sharding import EmbeddingShardingInfo
from torchrec.distributed.sharding.cw_sequence_sharding import CwSequenceEmbeddingSharding
from torchrec.distributed.sharding.cw_sharding import CwPooledEmbeddingSharding
from torchrec.distributed.types import ShardingEnv, ShardingType

from dynemb.shard.compute_kernel import BatchedDynamicEmbedding, BatchedDynamicEmbeddingBag
from dynemb.shard.rw_sharding import (
    DynamicEmbGroupedEmbeddingsLookup,
    DynamicEmbGroupedPooledEmbeddingsLookup,
    dynamic_options,
    is_dynamic,
)
from dynemb.shard.slice_agreement import SliceAgreement
from dynemb.shard.tw_sharding import check_whole_tables


def check_one_slice_per_rank(infos: list[EmbeddingShardingInfo]) -> None:
    """Raises ValueError for a dynamic table with two slices on one rank (a rank's
    tables are found by name: one slice of a table per rank)."""
    for info in infos:
        ranks = info.param_sharding.ranks or []
        if is_dynamic(info) and len(set(ranks)) != len(ranks):
            raise ValueError(
                f"table {info.embedding_config.name!r}: a column-wise dynamic table has one "
                f"slice per rank, got ranks {ranks}"
            )


def slice_options(grouped_configs, table_options: dict) -> dict:
    """This rank's options of each dynamic table: its slice's width and columns (and
    those columns of its warm-start source)."""
    options = {}
    for group in grouped_configs:
        for table in group.embedding_tables:
            opts = table_options.get(table.name)
            if opts is not None:
                offset = table.local_metadata.shard_offsets[1]
                hbm = opts.local_hbm_for_values * table.local_cols // table.embedding_dim
                source = opts.warm_start
                options[table.name] = dataclasses.replace(
                    opts,
                    dim=table.local_cols,
                    column_offset=offset,
                    local_hbm_for_values=hbm,  # the slice's columns' share
                    # The slice's columns of the whole rows (their optimizer state
                    # initialised: a slice's state is not a column range of the rows').
                    warm_start=None if source is None else source.columns(offset, table.local_cols),
                )
    return options


class _DynamicSlices:
    """What the pooled and the sequence column-wise shardings add to TorchRec's: the
    checks of the plan and each table's options, cut to this rank's slice."""

    def __init__(
        self,
        sharding_infos,
        env: ShardingEnv,
        device=None,
        permute_embeddings: bool = False,
        qcomm_codecs_registry=None,
    ):
        check_whole_tables(sharding_infos)
        check_one_slice_per_rank(sharding_infos)
        self._table_options = dynamic_options(sharding_infos)
        self.agreement = SliceAgreement(sharding_infos, env, device)
        super().__init__(
            sharding_infos,
            env,
            device,
            permute_embeddings=permute_embeddings,
            qcomm_codecs_registry=qcomm_codecs_registry,
        )

    def _slice_options(self) -> dict:
        return slice_options(self._grouped_embedding_configs, self._table_options)


class _CheckedSlices:
    """A column-wise lookup whose training forwards end with its sharding's
    SliceAgreement check (slice_agreement.py), its dynamic kernels registered there."""

    def __init__(self, agreement: SliceAgreement, *args, **kwargs):
        object.__setattr__(self, "_agreement", agreement)  # read during super init
        super().__init__(*args, **kwargs)

    def _create_embedding_kernel(self, *args, **kwargs):
        kernel = super()._create_embedding_kernel(*args, **kwargs)
        if isinstance(kernel, (BatchedDynamicEmbedding, BatchedDynamicEmbeddingBag)):
            self._agreement.add(kernel.emb_module)
        return kernel

    def forward(self, sparse_features):
        out = super().forward(sparse_features)
        if self.training:
            self._agreement.check()
        return out


class DynamicEmbCwPooledLookup(_CheckedSlices, DynamicEmbGroupedPooledEmbeddingsLookup):
    """The pooled lookup of column slices (checked for agreement)."""


class DynamicEmbCwSequenceLookup(_CheckedSlices, DynamicEmbGroupedEmbeddingsLookup):
    """The sequence lookup of column slices (checked for agreement)."""


class DynamicEmbCwPooledEmbeddingSharding(_DynamicSlices, CwPooledEmbeddingSharding):
    """Column-wise pooled sharding (EBC) holding dynamic tables."""

    def create_lookup(self, device=None, fused_params=None, feature_processor=None):
        return DynamicEmbCwPooledLookup(
            self.agreement,
            self._slice_options(),
            {},
            grouped_configs=self._grouped_embedding_configs,
            pg=self._pg,
            device=device if device is not None else self._device,
            feature_processor=feature_processor,
            sharding_type=ShardingType.COLUMN_WISE,
            env=self._env,
        )


class DynamicEmbCwSequenceEmbeddingSharding(_DynamicSlices, CwSequenceEmbeddingSharding):
    """Column-wise sequence sharding (EC) holding dynamic tables: each slice's rank
    looks up every id of the table's features and returns its columns of each id's
    row; TorchRec's output dist sends them back and the EC joins the slices."""

    def create_lookup(self, device=None, fused_params=None, feature_processor=None):
        return DynamicEmbCwSequenceLookup(
            self.agreement,
            self._slice_options(),
            {},
            grouped_configs=self._grouped_embedding_configs,
            pg=self._pg,
            device=device if device is not None else self._device,
            env=self._env,
        )


__all__ = [
    "DynamicEmbCwPooledEmbeddingSharding",
    "DynamicEmbCwPooledLookup",
    "DynamicEmbCwSequenceLookup",
    "DynamicEmbCwSequenceEmbeddingSharding",
    "check_one_slice_per_rank",
]
