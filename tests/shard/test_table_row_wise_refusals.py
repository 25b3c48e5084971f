"""What table-row-wise sharding refuses, before anything is built: an EmbeddingCollection's
dynamic tables (TorchRec has no TWRW for sequence tables), and a plan entry whose ranks
are not one node's ranks in order."""

import re

import pytest
import torch
from torchrec.distributed.embedding_sharding import EmbeddingShardingInfo
from torchrec.distributed.types import ParameterSharding
from torchrec.modules.embedding_configs import EmbeddingTableConfig

from dynemb.distributed.sharding_names import DYNAMIC_KERNEL_NAME
from dynemb.shard import ShardedDynamicEmbeddingCollection
from dynemb.shard.twrw_sharding import check_node_ranks, node_ranks

pytestmark = pytest.mark.no_emulated_pass("TorchRec plumbing: no table op runs")


def _info(ranks: list[int], kernel: str = DYNAMIC_KERNEL_NAME) -> EmbeddingShardingInfo:
    config = EmbeddingTableConfig(num_embeddings=10, embedding_dim=4, name="t", feature_names=["f"])
    sharding = ParameterSharding(sharding_type="table_row_wise", compute_kernel=kernel, ranks=ranks)
    return EmbeddingShardingInfo(config, sharding, torch.empty(0))


def test_embedding_collection_refuses_table_row_wise_dynamic_tables():
    with pytest.raises(ValueError, match=r"tables \['t'\].*'table_row_wise'.*no table-row-wise"):
        ShardedDynamicEmbeddingCollection.create_embedding_sharding(
            "table_row_wise", [_info([0, 1])], env=None
        )


def test_node_ranks_are_consecutive_blocks_of_the_node_size():
    assert node_ranks(0, 2) == [0, 1]
    assert node_ranks(1, 2) == [2, 3]
    assert node_ranks(1, 4) == [4, 5, 6, 7]


@pytest.mark.parametrize(
    "ranks, node", [([1, 2], [0, 1]), ([3, 2], [2, 3]), ([2], [2, 3]), ([0, 1, 2, 3], [0, 1])]
)
def test_ranks_outside_one_node_are_refused(ranks, node):
    match = f"table 't'.*got ranks {re.escape(str(ranks))} \\(expected {re.escape(str(node))}\\)"
    with pytest.raises(ValueError, match=match):
        check_node_ranks([_info(ranks)], local_size=2)


def test_one_nodes_ranks_and_ordinary_tables_pass():
    check_node_ranks([_info([2, 3])], local_size=2)
    check_node_ranks([_info([1, 2], kernel="fused")], local_size=2)  # TorchRec's to place
