"""The plan entry of a dynamic table: TorchRec's ParameterSharding plus its per-rank options."""

import dataclasses

from torchrec.distributed.embedding_types import EmbeddingComputeKernel
from torchrec.distributed.types import ParameterSharding

from dynemb.config.table_options import DynamicEmbTableOptions


@dataclasses.dataclass
class DynamicEmbParameterSharding(ParameterSharding):
    """A ROW_WISE, TABLE_WISE, COLUMN_WISE or TABLE_ROW_WISE / CUSTOMIZED_KERNEL plan
    entry carrying the table's per-rank options.

    ``dynamicemb_options`` is what every rank holding the table builds its shard from:
    ``max_capacity`` and ``init_capacity`` are per-rank row counts (table-wise: the
    whole table's; table-row-wise: a share of the node's ranks), ``dim`` the table's width,
    ``local_hbm_for_values`` per-rank bytes. The planner fills it; the sharders of
    ``dynemb.shard`` read it. As in DynamicEmb, ``compute_kernel`` defaults to
    CUSTOMIZED_KERNEL, ``customized_compute_kernel`` names the kernel ("DynamicEmb")
    and ``dist_type`` repeats the options' routing.

    ``ordinary_table`` (dynemb only) marks an ordinary table held as a dynamic one
    (the planner's ``ordinary_tables_as_dynamic``): its ids must lie in
    ``[0, num_embeddings)`` and every row of a rank's block is stored when the
    table is built.
    """

    compute_kernel: str = EmbeddingComputeKernel.CUSTOMIZED_KERNEL.value
    customized_compute_kernel: str = "DynamicEmb"
    dist_type: str = "roundrobin"
    dynamicemb_options: DynamicEmbTableOptions = dataclasses.field(
        default_factory=DynamicEmbTableOptions
    )
    ordinary_table: bool = False
