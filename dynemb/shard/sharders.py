"""The EBC / EC sharders: TorchRec's, plus ROW_WISE on cpu and the dynamic kernel."""

from torchrec.distributed.embedding import EmbeddingCollectionSharder
from torchrec.distributed.embedding_types import EmbeddingComputeKernel
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.types import ShardingType

DYNAMIC_KERNEL = EmbeddingComputeKernel.CUSTOMIZED_KERNEL.value


def _sharding_types(types: list[str]) -> list[str]:
    # TorchRec offers ROW_WISE on cuda only; its row-wise machinery runs over gloo too.
    return types if ShardingType.ROW_WISE.value in types else types + [ShardingType.ROW_WISE.value]


def _compute_kernels(kernels: list[str], sharding_type: str) -> list[str]:
    if sharding_type == ShardingType.ROW_WISE.value:
        return kernels + [DYNAMIC_KERNEL]
    return kernels


class DynamicEmbeddingBagCollectionSharder(EmbeddingBagCollectionSharder):
    """Drop-in for TorchRec's EmbeddingBagCollectionSharder (same arguments)."""

    def sharding_types(self, compute_device_type: str) -> list[str]:
        return _sharding_types(super().sharding_types(compute_device_type))

    def compute_kernels(self, sharding_type: str, compute_device_type: str) -> list[str]:
        return _compute_kernels(
            super().compute_kernels(sharding_type, compute_device_type), sharding_type
        )


class DynamicEmbeddingCollectionSharder(EmbeddingCollectionSharder):
    """Drop-in for TorchRec's EmbeddingCollectionSharder (same arguments)."""

    def sharding_types(self, compute_device_type: str) -> list[str]:
        return _sharding_types(super().sharding_types(compute_device_type))

    def compute_kernels(self, sharding_type: str, compute_device_type: str) -> list[str]:
        return _compute_kernels(
            super().compute_kernels(sharding_type, compute_device_type), sharding_type
        )
