"""The planner counts a table's hot-key replica (``hot_replicas``) on every rank."""

import pytest
from torchrec.distributed.planner.types import Storage

from dynemb import DynamicEmbTableOptions
from dynemb.optimizer import EmbOptimType
from dynemb.planner import DynamicEmbParameterConstraints
from dynemb.shard import DynamicEmbeddingBagCollectionSharder
from tests.support.planner_models import USER_ROWS_PER_RANK, by_table, enumerate_options

pytestmark = pytest.mark.no_emulated_pass("planning: no table op runs")


@pytest.mark.parametrize("compute_device, k", [("cpu", 100), ("cuda", 100), ("cpu", 1000)])
def test_replica_rows_are_counted_on_every_rank(compute_device, k):
    constraints = {
        "user": DynamicEmbParameterConstraints(
            use_dynamicemb=True,
            dynamicemb_options=DynamicEmbTableOptions(hot_replicas=k, global_hbm_for_values=0),
        )
    }
    optimizer = EmbOptimType.EXACT_ROWWISE_ADAGRAD  # 8 + 1 columns
    sharders = [DynamicEmbeddingBagCollectionSharder(fused_params={"optimizer": optimizer})]
    (user,) = by_table(enumerate_options(compute_device, constraints, module_sharders=sharders))[
        "user"
    ]
    replica = 128 * -(-4 * k // 128) * 9 * 4  # whole buckets of 128 slots, a quarter full
    table = USER_ROWS_PER_RANK * 9 * 4
    if compute_device == "cpu":
        expected = Storage(hbm=0, ddr=table + replica)
    else:
        expected = Storage(hbm=replica, ddr=table)
    assert [shard.storage for shard in user.shards] == [expected, expected]
