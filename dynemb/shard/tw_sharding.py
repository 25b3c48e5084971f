"""Table-wise sharding of dynamic tables: TorchRec's TW sharding with our kernels.

A table-wise table lives whole on the one rank its plan entry names, as TorchRec's
TABLE_WISE tables do: TorchRec's input dist sends each of its features, keys
untouched, to that rank (no key routing), the rank's kernel pools the bags of the
global batch, and TorchRec's output dist sends each sample's pooled row back to the
sample's rank. Dynamic and ordinary table-wise tables can share the sharding: each
group of tables gets its kernel (ours for CUSTOMIZED_KERNEL groups, TorchRec's
otherwise). MEAN pools inside our kernel (nothing to divide after the all-to-all).
"""

from torchrec.distributed.embedding_sharding import EmbeddingShardingInfo
from torchrec.distributed.sharding.tw_sequence_sharding import TwSequenceEmbeddingSharding
from torchrec.distributed.sharding.tw_sharding import TwPooledEmbeddingSharding
from torchrec.distributed.types import ShardingEnv, ShardingType

from dynemb.shard.rw_sharding import (
    DynamicEmbGroupedEmbeddingsLookup,
    DynamicEmbGroupedPooledEmbeddingsLookup,
    dynamic_options,
    is_dynamic,
)


def check_whole_tables(infos: list[EmbeddingShardingInfo]) -> None:
    """Raises ValueError for an ordinary table held as a dynamic one (row-wise only:
    its rows are TorchRec's row-wise blocks)."""
    for info in infos:
        if is_dynamic(info) and getattr(info.param_sharding, "ordinary_table", False):
            raise ValueError(
                f"table {info.embedding_config.name!r}: an ordinary table held as a dynamic "
                f"one is sharded row_wise, got {info.param_sharding.sharding_type!r}"
            )


class DynamicEmbTwPooledEmbeddingSharding(TwPooledEmbeddingSharding):
    """Table-wise pooled sharding (EBC) holding dynamic tables."""

    def __init__(self, sharding_infos, env: ShardingEnv, device=None, qcomm_codecs_registry=None):
        check_whole_tables(sharding_infos)
        self._dynamic_options = dynamic_options(sharding_infos)
        super().__init__(sharding_infos, env, device, qcomm_codecs_registry=qcomm_codecs_registry)

    def create_lookup(self, device=None, fused_params=None, feature_processor=None):
        return DynamicEmbGroupedPooledEmbeddingsLookup(
            self._dynamic_options,
            {},
            grouped_configs=self._grouped_embedding_configs,
            pg=self._pg,
            device=device if device is not None else self._device,
            feature_processor=feature_processor,
            sharding_type=ShardingType.TABLE_WISE,
            env=self._env,
        )


class DynamicEmbTwSequenceEmbeddingSharding(TwSequenceEmbeddingSharding):
    """Table-wise sequence sharding (EC) holding dynamic tables."""

    def __init__(self, sharding_infos, env: ShardingEnv, device=None, qcomm_codecs_registry=None):
        check_whole_tables(sharding_infos)
        self._dynamic_options = dynamic_options(sharding_infos)
        super().__init__(sharding_infos, env, device, qcomm_codecs_registry=qcomm_codecs_registry)

    def create_lookup(self, device=None, fused_params=None, feature_processor=None):
        return DynamicEmbGroupedEmbeddingsLookup(
            self._dynamic_options,
            {},
            grouped_configs=self._grouped_embedding_configs,
            pg=self._pg,
            device=device if device is not None else self._device,
            env=self._env,
        )


__all__ = [
    "DynamicEmbTwPooledEmbeddingSharding",
    "DynamicEmbTwSequenceEmbeddingSharding",
    "check_whole_tables",
]
