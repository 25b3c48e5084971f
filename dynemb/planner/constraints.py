"""TorchRec's per-table ParameterConstraints, plus the switch that makes a table dynamic."""

import dataclasses

from torchrec.distributed.planner.types import ParameterConstraints

from dynemb.config.table_options import DynamicEmbTableOptions

__all__ = ["DynamicEmbParameterConstraints", "is_dynamic"]


@dataclasses.dataclass
class DynamicEmbParameterConstraints(ParameterConstraints):
    """Constraints of one table; ``use_dynamicemb=True`` makes it a dynamic table.

    Every field of TorchRec's ``ParameterConstraints`` keeps its meaning (pooling
    factors, batch sizes, feature names, ...). A dynamic table uses
    ``EmbeddingComputeKernel.CUSTOMIZED_KERNEL`` (leave ``compute_kernels`` unset or
    give exactly it) and is sharded under the ``sharding_types`` listed, among
    ``row_wise`` (keys routed to their owner over all ranks), ``table_wise`` (the
    whole table on one rank), ``column_wise`` (a column slice of every row on each
    of its ranks) and, for pooled tables, ``table_row_wise`` (keys routed to their
    owner over the ranks of one node); unset, ``row_wise``.

    Args:
        use_dynamicemb: shard this table as a dynamic (hash) table.
        dynamicemb_options: the table's options. The planner never modifies them: it
            fills a per-rank copy (``dim``, ``max_capacity``, ``init_capacity``,
            ``bucket_capacity``, ``local_hbm_for_values``, initializer bounds) and puts
            it in the plan.

    Example::

        constraints = {
            "user_id": DynamicEmbParameterConstraints(
                use_dynamicemb=True,
                pooling_factors=[2.0],
                dynamicemb_options=DynamicEmbTableOptions(
                    score_strategy=DynamicEmbScoreStrategy.LFU, bucket_capacity=64
                ),
            ),
            "country": ParameterConstraints(sharding_types=["table_wise"]),
        }
    """

    use_dynamicemb: bool = False
    dynamicemb_options: DynamicEmbTableOptions = dataclasses.field(
        default_factory=DynamicEmbTableOptions
    )

    # dataclass(eq=True) would set __hash__ to None; TorchRec hashes constraints to
    # fingerprint a planner's inputs. Options hold unhashable fields, so hash their repr.
    def __hash__(self) -> int:
        return hash((super().__hash__(), self.use_dynamicemb, repr(self.dynamicemb_options)))


def is_dynamic(constraints: ParameterConstraints | None) -> bool:
    """Whether ``constraints`` make their table dynamic."""
    return isinstance(constraints, DynamicEmbParameterConstraints) and constraints.use_dynamicemb
