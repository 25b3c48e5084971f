"""DynamicEmbeddingEnumerator: which options each table gets, and their estimates."""

import pytest
from torchrec.distributed.embedding_types import EmbeddingComputeKernel
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.planner import ParameterConstraints, Topology
from torchrec.distributed.planner.enumerators import EmbeddingEnumerator
from torchrec.distributed.planner.types import Storage

from dynemb import DynamicEmbTableOptions
from dynemb.optimizer import EmbOptimType
from dynemb.planner import DynamicEmbParameterConstraints
from dynemb.shard import DynamicEmbeddingBagCollectionSharder
from tests.support.planner_models import (
    DYNAMIC_KERNEL,
    ROW_WISE,
    USER_ROWS_PER_RANK,
    Model,
    by_table,
    enumerate_options,
    make_constraints,
)

pytestmark = pytest.mark.no_emulated_pass("planning: no table op runs")


@pytest.mark.parametrize("compute_device", ["cpu", "cuda"])
def test_dynamic_tables_get_exactly_row_wise_dynamic_kernel(compute_device):
    tables = by_table(enumerate_options(compute_device))
    for name in ("user", "item", "query"):
        assert [(so.sharding_type, so.compute_kernel) for so in tables[name]] == [
            (ROW_WISE, DYNAMIC_KERNEL)
        ], name


@pytest.mark.parametrize("compute_device", ["cpu", "cuda"])
def test_ordinary_tables_never_get_the_dynamic_kernel(compute_device):
    tables = by_table(enumerate_options(compute_device))
    for name in ("country", "lang"):
        kernels = {so.compute_kernel for so in tables[name]}
        assert kernels and DYNAMIC_KERNEL not in kernels, name
        assert ROW_WISE in {so.sharding_type for so in tables[name]}, name


def test_ordinary_tables_on_cpu_get_cpu_kernels_only():
    tables = by_table(enumerate_options("cpu"))
    for name in ("country", "lang"):
        assert {so.compute_kernel for so in tables[name]} <= {"dense", "fused"}, name


class UvmOnCpuSharder(DynamicEmbeddingBagCollectionSharder):
    """Offers fused_uvm on cpu too, as a custom sharder might."""

    def compute_kernels(self, sharding_type, compute_device_type):
        kernels = super().compute_kernels(sharding_type, compute_device_type)
        return kernels + [EmbeddingComputeKernel.FUSED_UVM.value]


def test_uvm_kernels_are_dropped_on_cpu():
    # TorchRec's own enumerator hands fused_uvm to its cpu estimator, which rejects it.
    plain = EmbeddingEnumerator(topology=Topology(world_size=2, compute_device="cpu"), batch_size=8)
    with pytest.raises(ValueError, match="fused_uvm"):
        plain.enumerate(Model(), [UvmOnCpuSharder()])
    options = enumerate_options("cpu", constraints={}, module_sharders=[UvmOnCpuSharder()])
    kernels = {so.compute_kernel for so in options if so.name in ("user", "country")}
    assert kernels == {"dense", "fused"}  # dense: data_parallel


def test_user_kernel_constraints_of_ordinary_tables_are_kept():
    constraints = make_constraints()
    constraints["country"] = ParameterConstraints(sharding_types=["table_wise"])
    constraints["lang"] = ParameterConstraints(compute_kernels=["fused"])
    tables = by_table(enumerate_options("cpu", constraints=constraints))
    assert {(so.sharding_type, so.compute_kernel) for so in tables["country"]} == {
        ("table_wise", "fused")
    }
    assert {so.compute_kernel for so in tables["lang"]} == {"fused"}


@pytest.mark.parametrize(
    "optimizer, columns",
    [(EmbOptimType.EXACT_SGD, 8), (EmbOptimType.EXACT_ROWWISE_ADAGRAD, 9), (EmbOptimType.ADAM, 24)],
)
def test_cpu_storage_is_rank_value_bytes_in_ddr(optimizer, columns):
    module_sharders = [DynamicEmbeddingBagCollectionSharder(fused_params={"optimizer": optimizer})]
    (user,) = by_table(enumerate_options("cpu", module_sharders=module_sharders))["user"]
    expected = Storage(hbm=0, ddr=USER_ROWS_PER_RANK * columns * 4)
    assert [shard.storage for shard in user.shards] == [expected, expected]


@pytest.mark.parametrize(
    "global_hbm, hbm",
    [
        (0, 0),  # values on the host
        (20_000, 10_000),  # 10_000 of 16_384 bytes per rank in HBM
        (10**9, 16_384),  # all in HBM
    ],
)
def test_cuda_storage_splits_hbm_and_ddr_by_local_hbm(global_hbm, hbm):
    constraints = {
        "user": DynamicEmbParameterConstraints(
            use_dynamicemb=True,
            dynamicemb_options=DynamicEmbTableOptions(global_hbm_for_values=global_hbm),
        )
    }
    (user,) = by_table(enumerate_options("cuda", constraints=constraints))["user"]
    total = USER_ROWS_PER_RANK * 8 * 4
    assert [shard.storage for shard in user.shards] == [Storage(hbm=hbm, ddr=total - hbm)] * 2


@pytest.mark.parametrize("compute_device", ["cpu", "cuda"])
def test_dynamic_options_get_a_perf_estimate(compute_device):
    for so in enumerate_options(compute_device):
        if so.compute_kernel == DYNAMIC_KERNEL:
            assert all(shard.perf is not None and shard.perf.total > 0 for shard in so.shards)


@pytest.mark.parametrize("compute_device", ["cpu", "cuda"])
def test_dynamic_table_needs_a_dynamic_sharder(compute_device):
    # On cpu TorchRec's sharder offers no row_wise; on cuda no customized_kernel.
    with pytest.raises(ValueError, match="table 'user' is dynamic.*dynemb.shard"):
        enumerate_options(
            compute_device,
            constraints={"user": make_constraints()["user"]},
            module_sharders=[EmbeddingBagCollectionSharder()],
        )


def test_dynamic_table_needs_cpu_or_cuda():
    with pytest.raises(ValueError, match="table 'user': dynamic tables run on"):
        enumerate_options("mtia", constraints={"user": make_constraints()["user"]})
