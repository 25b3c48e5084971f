"""``BatchedDynamicEmbeddingTablesV2``: DynamicEmb's batched module (``dynemb.
batched_dynamicemb_tables`` re-exports it at DynamicEmb's path).

DynamicEmb users construct ``dynamicemb.batched_dynamicemb_tables.
BatchedDynamicEmbeddingTablesV2`` with fbgemm TBE-style arguments; this class takes
the same arguments (same order and defaults) and is a
``BatchedDynamicEmbeddingTables`` (same forward, backward, attributes).
"""

from collections.abc import Sequence

import torch
from fbgemm_gpu.split_table_batched_embeddings_ops_common import BoundsCheckMode
from fbgemm_gpu.split_table_batched_embeddings_ops_training import WeightDecayMode

from dynemb.config.optimizer import EmbOptimType, OptimType
from dynemb.config.table_options import DynamicEmbTableOptions
from dynemb.config.types import DynamicEmbPoolingMode
from dynemb.tbe.batched_dynamic_embedding_tables import BatchedDynamicEmbeddingTables
from dynemb.tbe.v2_caching import CachingMembers
from dynemb.tbe.v2_checkpoint import CheckpointMembers

__all__ = ["BatchedDynamicEmbeddingTablesV2"]

_OUTPUT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# DynamicEmb's FTRL hyper-parameters, which its constructor takes among **kwargs.
_FTRL_KWARGS = ("learning_rate_power", "ftrl_beta", "l1_reg", "l2_reg")


class BatchedDynamicEmbeddingTablesV2(
    CheckpointMembers, CachingMembers, BatchedDynamicEmbeddingTables
):
    """DynamicEmb's constructor over dynemb's ``BatchedDynamicEmbeddingTables``, with
    DynamicEmb's public members: ``dump`` / ``load`` / ``export_keys_values`` /
    ``get_score`` / ``set_score`` / ``incremental_dump`` (dynemb.tbe.v2_checkpoint),
    ``optimizer`` / ``cache`` / ``enable_prefetch`` / ``set_record_cache_metrics`` /
    ``reset_cache_states`` / ``split_embedding_weights`` / ``fill_tables``
    (dynemb.tbe.v2_caching); ``flush``, ``set_learning_rate``, ``table_names``,
    ``tables`` as in BatchedDynamicEmbeddingTables.

    Args:
        table_options: one DynamicEmbTableOptions per table (``dim`` and
            ``max_capacity`` set).
        table_names: one name per table, each used once (default ``table_0``, ...).
        feature_table_map: the table of each feature (default: one feature per table,
            ``[0, 1, ..., T - 1]``).
        use_index_dedup: accepted; lookups always de-duplicate keys per table.
        prefetch_pipeline: the initial ``enable_prefetch``; caching tables prefetch
            through ``prefetch``.
        pooling_mode: SUM, MEAN or NONE.
        output_dtype: dtype of the forward output: float32, float16 or bfloat16 (rows
            are pooled in float32, then cast).
        device: where the tables live (default CPU).
        enforce_hbm, bounds_check_mode, stochastic_rounding: accepted; no effect (keys
            are unbounded; a table's rounding is its options' ``stochastic_rounding``).
        optimizer: SGD (default), EXACT_SGD, EXACT_ADAGRAD, EXACT_ROWWISE_ADAGRAD,
            ADAM, or ``DynamicEmbOptimType.FTRL``.
        learning_rate, eps, beta1, beta2, weight_decay: the optimizer's
            hyper-parameters (as in BatchedDynamicEmbeddingTables).
        gradient_clipping, max_gradient, max_norm, momentum, eta, weight_decay_mode,
            counter_based_regularization, cowclip_regularization: accepted; no
            effect on the supported optimizers (weight decay is applied as fbgemm's GPU
            kernels do: L2 for SGD and the Adagrads, decoupled for Adam).
        initial_accumulator_value: FTRL's accumulator of new rows; 0.0 with the other
            optimizers.
        learning_rate_power, ftrl_beta, l1_reg, l2_reg (keywords): FTRL's
            hyper-parameters (dynemb.optimizer.OptimizerConfig).

    Raises:
        ValueError: an ``output_dtype`` other than float32 / float16 / bfloat16, a
            non-zero ``initial_accumulator_value`` without FTRL, and
            BatchedDynamicEmbeddingTables' errors.

    Example::

        tables = BatchedDynamicEmbeddingTablesV2(
            [DynamicEmbTableOptions(dim=8, max_capacity=1024)], table_names=["t0"],
            output_dtype=torch.float16,
        )
        tables(torch.tensor([3, 4]), torch.tensor([0, 1, 2])).dtype  # torch.float16
    """

    def __init__(
        self,
        table_options: Sequence[DynamicEmbTableOptions],
        table_names: Sequence[str] | None = None,
        feature_table_map: Sequence[int] | None = None,
        use_index_dedup: bool = False,
        prefetch_pipeline: bool = False,
        pooling_mode: DynamicEmbPoolingMode = DynamicEmbPoolingMode.SUM,
        output_dtype: torch.dtype = torch.float32,
        device: str | torch.device | None = None,
        enforce_hbm: bool = False,
        bounds_check_mode: BoundsCheckMode = BoundsCheckMode.WARNING,
        optimizer: OptimType = EmbOptimType.SGD,
        stochastic_rounding: bool = True,
        gradient_clipping: bool = False,
        max_gradient: float = 1.0,
        max_norm: float = 0.0,
        learning_rate: float = 0.01,
        eps: float = 1.0e-8,
        initial_accumulator_value: float = 0.0,
        momentum: float = 0.9,
        weight_decay: float = 0.0,
        weight_decay_mode: WeightDecayMode = WeightDecayMode.NONE,
        eta: float = 0.001,
        beta1: float = 0.9,
        beta2: float = 0.999,
        counter_based_regularization=None,
        cowclip_regularization=None,
        *args,
        **kwargs,
    ) -> None:
        if output_dtype not in _OUTPUT_DTYPES:
            raise ValueError(f"output_dtype must be one of {_OUTPUT_DTYPES}, got {output_dtype!r}")
        options = list(table_options)
        super().__init__(
            options,
            feature_table_map=(
                list(range(len(options))) if feature_table_map is None else feature_table_map
            ),
            pooling_mode=pooling_mode,
            optimizer=optimizer,
            learning_rate=learning_rate,
            eps=eps,
            beta1=beta1,
            beta2=beta2,
            weight_decay=weight_decay,
            table_names=table_names,
            device=device,
            initial_accumulator_value=initial_accumulator_value,
            **{k: kwargs.pop(k) for k in _FTRL_KWARGS if k in kwargs},
        )
        self.output_dtype = output_dtype
        self.use_index_dedup = use_index_dedup
        self.prefetch_pipeline = prefetch_pipeline
        self.enable_prefetch = bool(prefetch_pipeline)

    def forward(
        self,
        indices: torch.Tensor,
        offsets: torch.Tensor,
        per_sample_weights: torch.Tensor | None = None,
        access_counts: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """As ``BatchedDynamicEmbeddingTables.forward``, cast to ``output_dtype``."""
        out = super().forward(indices, offsets, per_sample_weights, access_counts)
        return out if out.dtype == self.output_dtype else out.to(self.output_dtype)
