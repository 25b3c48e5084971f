"""``BatchedDynamicEmbeddingTablesV2``: DynamicEmb's batched module (``dynemb.
batched_dynamicemb_tables`` re-exports it at DynamicEmb's path).

DynamicEmb users construct ``dynamicemb.batched_dynamicemb_tables.
BatchedDynamicEmbeddingTablesV2`` with fbgemm TBE-style arguments; this class takes
the same arguments (same order and defaults) and is a
``BatchedDynamicEmbeddingTables`` (same forward, backward, attributes).
"""

import math
from collections.abc import Sequence

import torch
import torch.distributed as dist
from fbgemm_gpu.split_table_batched_embeddings_ops_common import BoundsCheckMode
from fbgemm_gpu.split_table_batched_embeddings_ops_training import WeightDecayMode

from dynemb.checkpoint import incremental
from dynemb.checkpoint.load import DynamicEmbLoad
from dynemb.checkpoint.writer import DynamicEmbDump
from dynemb.config.optimizer import EmbOptimType, OptimizerConfig, OptimType
from dynemb.config.table_options import BATCH_SIZE_PER_DUMP, DynamicEmbTableOptions
from dynemb.config.types import DynamicEmbPoolingMode, DynamicEmbScoreStrategy
from dynemb.table.batches_in_flight import refuse_batches_in_flight
from dynemb.tbe.batched_dynamic_embedding_tables import BatchedDynamicEmbeddingTables
from dynemb.tiering.cache import Cache

__all__ = ["BatchedDynamicEmbeddingTablesV2"]

_OUTPUT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# DynamicEmb's FTRL hyper-parameters, which its constructor takes among **kwargs.
_FTRL_KWARGS = ("learning_rate_power", "ftrl_beta", "l1_reg", "l2_reg")
# The collection name of a module dumped or scored by itself.
_SELF = "model"
_CUSTOMIZED = DynamicEmbScoreStrategy.CUSTOMIZED.value
_FILL_ROUNDS = 64  # insert rounds per table in fill_tables (evictions and growth take a few)


class BatchedDynamicEmbeddingTablesV2(BatchedDynamicEmbeddingTables):
    """DynamicEmb's constructor over dynemb's ``BatchedDynamicEmbeddingTables``, with
    DynamicEmb's public members: ``dump`` / ``load`` / ``export_keys_values`` /
    ``get_score`` / ``set_score`` / ``incremental_dump`` (each the model-level
    function of dynemb applied to this module alone, its tables forming the collection
    ``"model"``), ``optimizer`` / ``cache`` / ``enable_prefetch`` /
    ``set_record_cache_metrics`` / ``reset_cache_states`` / ``split_embedding_weights``
    / ``fill_tables`` (caching acts on the cached tables, a ``dynemb.tiering.CachedTable``
    in ``tables``, and does nothing harmful on the others); ``flush``, ``set_learning_rate``, ``table_names``,
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
        self._record_cache_metrics = False
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

    # ------------------------------------------------------- checkpoints, scores

    def dump(
        self,
        save_dir: str,
        optim: bool = False,
        counter: bool = False,
        table_names: list[str] | None = None,
        pg: dist.ProcessGroup | None = None,
        *,
        format: str = "dynemb",  # DynamicEmbDump's argument
    ) -> None:
        """Writes this module's tables (or ``table_names``) to ``save_dir``: the files
        ``DynamicEmbDump(save_dir, module, ...)`` writes, replacing what ``save_dir``
        held. ``format="dynamicemb"`` writes DynamicEmb's layout
        (``save_dir/model/<table>_emb_keys.rank_<r>.world_size_<W>`` ...).

        Every rank of ``pg`` (default: the world, or this process alone) must call it.

        Example::

            tables.dump("/ckpt/tables", optim=True)
        """
        DynamicEmbDump(
            save_dir, self, table_names=table_names, optim=optim, counter=counter, pg=pg,
            allow_overwrite=True, format=format,
        )  # fmt: skip

    def load(
        self,
        save_dir: str,
        optim: bool = False,
        counter: bool = False,
        table_names: list[str] | None = None,
        pg: dist.ProcessGroup | None = None,
    ) -> None:
        """Reads a ``dump`` of this module (either format) back into its tables, as
        ``DynamicEmbLoad(save_dir, module, ...)`` does (at any world size).

        Example::

            fresh.load("/ckpt/tables", optim=True)
        """
        DynamicEmbLoad(save_dir, self, table_names=table_names, optim=optim, counter=counter, pg=pg)

    def export_keys_values(
        self, table_name: str, device: torch.device, batch_size: int = BATCH_SIZE_PER_DUMP
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Every key of table ``table_name`` on this rank and its embedding.

        Args:
            table_name: one of ``table_names``.
            device: where the results go.
            batch_size: slots read at once (bounds the temporary memory), > 0.

        Returns:
            ``(keys, embeddings)``: (n,) int64 and (n, dim) in the table's dtype, on
            ``device``, in slot order (caching: the whole table, cache written back).

        Raises:
            ValueError: an unknown ``table_name`` or a ``batch_size`` below 1.
        """
        if table_name not in self.table_names:
            raise ValueError(
                f"export_keys_values: `table_name` {table_name!r} is not a table of this "
                f"module ({self.table_names})"
            )
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(
                f"export_keys_values: `batch_size` must be an int >= 1, got {batch_size!r}"
            )
        table = self.tables[self.table_names.index(table_name)].persistent_table()
        keys, rows, offset = [], [], 0
        while offset < table.capacity():
            k, v, _, offset = table.export_batch(offset, batch_size)
            keys.append(k.to(device))
            rows.append(v[:, : table.dim].to(device))
        if not keys:
            empty = torch.empty((0, table.dim), dtype=table.value_dtype, device=device)
            return torch.empty(0, dtype=torch.int64, device=device), empty
        return torch.cat(keys), torch.cat(rows)

    def get_score(self) -> dict[str, int]:
        """``{table name: score reference}``: for timestamp strategies the current time,
        for STEP the next step, for the others the table's score (see
        dynemb.incremental_dump.get_score)."""
        return incremental.get_score(self)[_SELF]

    def set_score(self, named_score: dict[str, int]) -> None:
        """Sets the score that keys of the named CUSTOMIZED tables get from now on
        (``{table name: int}``; see dynemb.incremental_dump.set_score for errors and
        the warning on a decrease)."""
        if not isinstance(named_score, dict):
            raise TypeError(
                f"set_score: `named_score` must be a dict of table name -> int, got {named_score!r}"
            )
        incremental.set_score(self, {_SELF: named_score})

    def incremental_dump(
        self,
        named_thresholds: dict[str, int] | None = None,
        pg: dist.ProcessGroup | None = None,
    ) -> tuple[dict[str, tuple[torch.Tensor, torch.Tensor]], dict[str, int]]:
        """The rows whose score is >= their table's threshold (timestamp strategies:
        rows touched since that time), on the host.

        Args:
            named_thresholds: ``{table name: int}`` (tables not named are not dumped), e.g.
                an earlier ``get_score()``; None: every row of every table.
            pg: gather every rank's rows (a collective over ``pg``); None: this rank's.

        Returns:
            ``({table: (keys (n,) int64, embeddings (n, dim))}, {table: score
            reference read before the dump})``.

        Example::

            ref = tables.get_score()
            ...train...
            rows, ref = tables.incremental_dump(ref)
        """
        if named_thresholds is None:
            threshold = 0
        elif isinstance(named_thresholds, dict):
            threshold = {_SELF: named_thresholds}
        else:
            raise TypeError(
                "incremental_dump: `named_thresholds` must be a dict of table name -> int "
                f"or None, got {named_thresholds!r}"
            )
        dumped, scores = incremental.incremental_dump(self, threshold, pg)
        return dumped.get(_SELF, {}), scores[_SELF]

    # ---------------------------------------------- caching, optimizer, benchmarks

    @property
    def optimizer(self) -> OptimizerConfig:
        """The fused optimizer: its type and hyper-parameters (``optimizer_config``)."""
        return self.optimizer_config

    @property
    def cache(self) -> list[Cache | None] | None:
        """Per table its ``Cache`` (caching tables) or None; None when no table caches."""
        caches = [t if t.has_cache else None for t in self.tables]
        return caches if any(c is not None for c in caches) else None

    @property
    def enable_prefetch(self) -> bool:
        """Whether batches are prefetched before their forward (``prefetch_pipeline`` at
        construction). dynemb's forward is correct either way: a batch not prefetched
        is fetched by its forward."""
        return self._enable_prefetch

    @enable_prefetch.setter
    def enable_prefetch(self, value: bool) -> None:
        if not isinstance(value, bool):
            raise TypeError(f"enable_prefetch must be a bool, got {value!r}")
        self._enable_prefetch = value

    def set_record_cache_metrics(self, record: bool) -> None:
        """Records whether cache metrics are wanted; dynemb counts them always, in
        ``cache_stats()`` (one CacheStats per caching table)."""
        if not isinstance(record, bool):
            raise TypeError(f"set_record_cache_metrics: `record` must be a bool, got {record!r}")
        self._record_cache_metrics = record

    def reset_cache_states(self) -> None:
        """Empties every cache (its rows are written back to the slow tier first, so
        nothing is lost) and zeroes its CacheStats; no-op without caching.

        Raises:
            RuntimeError: a batch is in flight (a prefetch or forward before its
                backward): call it between batches.
        """
        cached = [(t, table) for t, table in enumerate(self.tables) if table.has_cache]
        busy = [self.table_names[t] for t, table in cached if table.batches_in_flight()]
        if busy:
            raise RuntimeError(
                f"reset_cache_states: tables {busy} have batches in flight (prefetched or "
                "forwarded, not yet backwarded); call it between batches"
            )
        for _, table in cached:
            table.empty_cache()
            table.reset_stats()

    def split_embedding_weights(self) -> list[torch.Tensor]:
        """One placeholder per table, ``(0, dim)``: the rows live in the hash tables
        (read them with ``export_keys_values``)."""
        return [torch.empty((0, dim), device=self.device) for dim in self.dims]

    def fill_tables(self, load_factor: float = 0.95, tolerance: float = 1e-5) -> None:
        """Inserts random keys (with initialised rows) into every table until it holds
        at least ``(load_factor - tolerance) * capacity`` keys: a benchmarking aid that
        measures lookups at a given occupancy. Caching tables fill their slow tier.

        Raises:
            ValueError: ``load_factor`` outside (0, 1] or ``tolerance`` outside [0, 1).
            RuntimeError: a table has batches in flight (dynemb.table.batches_in_flight).
        """
        if (
            isinstance(load_factor, bool)
            or not isinstance(load_factor, (int, float))
            or not 0 < load_factor <= 1
        ):
            raise ValueError(f"fill_tables: `load_factor` must be in (0, 1], got {load_factor!r}")
        if (
            isinstance(tolerance, bool)
            or not isinstance(tolerance, (int, float))
            or not 0 <= tolerance < 1
        ):
            raise ValueError(f"fill_tables: `tolerance` must be in [0, 1), got {tolerance!r}")
        refuse_batches_in_flight(list(zip(self.table_names, self.tables)), "fill_tables")
        generator = torch.Generator().manual_seed(0)
        for table in self.tables:
            _fill(table.persistent_table(), load_factor - tolerance, generator)


def _fill(table, fraction: float, generator: torch.Generator) -> None:
    for _ in range(_FILL_ROUNDS):
        missing = math.ceil(fraction * table.capacity()) - table.size()
        if missing <= 0:
            return
        keys = torch.randint(
            -(2**63), 2**63 - 1, (missing,), dtype=torch.int64, generator=generator
        )
        keys = keys.to(table.device)
        scores = None
        if table.strategy_code == _CUSTOMIZED:
            scores = torch.full_like(keys, table.custom_score or 0)
        table.find_or_insert(keys, scores)
