"""The plan entry of a dynamic table: TorchRec's ParameterSharding plus its per-rank options."""

import dataclasses

from torchrec.distributed.types import ParameterSharding

from dynemb.dynamicemb_config import DynamicEmbTableOptions


@dataclasses.dataclass
class DynamicEmbParameterSharding(ParameterSharding):
    """A ROW_WISE / CUSTOMIZED_KERNEL plan entry carrying the table's per-rank options.

    ``dynamicemb_options`` is what every rank builds its shard from: ``max_capacity``
    and ``init_capacity`` are per-rank row counts, ``dim`` the table's width,
    ``local_hbm_for_values`` per-rank bytes. The planner fills it; the sharders of
    ``dynemb.shard`` read it.
    """

    dynamicemb_options: DynamicEmbTableOptions = dataclasses.field(
        default_factory=DynamicEmbTableOptions
    )
