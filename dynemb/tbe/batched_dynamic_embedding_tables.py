"""``BatchedDynamicEmbeddingTables``: the dynamic counterpart of fbgemm's TBE.

Forward looks each table's keys up (inserting new keys in training), pools them
(SUM / MEAN) or returns one row per index (NONE). Backward reduces the output gradient
to one gradient per distinct key of each table and applies the fused optimizer to
those rows in place: no dense gradient and no autograd leaf exist for the tables. The
per-element maths is in csrc/core (pooling.h, optimizer_rules.h). Tables are used
through the Table protocol only (dynemb/table/protocol.py), the same for every table.

The forward's phases:

1. split the batch by table and de-duplicate each table's keys (reusing a
   prefetch's result);
2. each table this forward trains begins a batch, in flight until the backward;
3. the slots of each table's distinct keys (a training lookup, grouped where tables
   allow it, or an eval read: the module's ``TableSlots``, table_slots.py), and where
   the rows are read (``batch_rows`` / ``eval_rows``);
4. pool (one grouped op call) or gather the rows into the output.

The backward's:

1. the rows in each table's ``buffers`` (one grouped op call when pooled; the slots
   found again in a table whose keys moved since the forward);
2. the rows a batch holds outside them (``staged_rows``: a cache's staged keys);
3. every table's ``end_batch``, even when an update raised.

Eviction by rule runs in the module's ``StaleKeys`` (stale_keys.py).
"""

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from dynemb import _ops, streams
from dynemb.admission_strategies import Counter
from dynemb.config.optimizer import EmbOptimType, OptimizerConfig, OptimType, hyper_parameter
from dynemb.config.table_options import DynamicEmbTableOptions, with_kernel_defaults
from dynemb.config.types import DynamicEmbPoolingMode
from dynemb.eviction_rules import ErasedKeys, EvictionRule
from dynemb.table.padded_keys import PaddedKeys
from dynemb.table.placement import canonical_device
from dynemb.table.protocol import Table
from dynemb.table.upsert_counts import TableTelemetry
from dynemb.tbe.batch_layout import (
    TableBatch,
    check_batch_layout,
    contiguous_batch,
    count_accesses,
    distinct_keys,
    split_by_table,
)
from dynemb.tbe.grouped_calls import backward_grouped, pool_grouped, table_locked
from dynemb.tbe.lookup_function import LookupFunction
from dynemb.tbe.stale_keys import StaleKeys
from dynemb.tbe.table_options import (
    admission_counter_of,
    admission_missing,
    check_options,
    init_list,
    table_names_of,
)
from dynemb.tbe.table_slots import TableSlots
from dynemb.tiering.batch_ledger import MAX_PENDING_PREFETCHES
from dynemb.tiering.factory import check_tiering_options, make_table
from dynemb.warm_start.optimizer_step import carried_step
from dynemb.warm_start.table_fill import check_source

POOLING_CODE = {
    mode: _ops.POOLING_CODES[mode.name]
    for mode in (DynamicEmbPoolingMode.SUM, DynamicEmbPoolingMode.MEAN)
}


@dataclasses.dataclass
class TableForward:
    """What a training forward keeps of one table for its backward.

    Attributes:
        tb: the table's share of the batch.
        unique: (U,) int64 distinct keys; ``inverse``: (n_t,) each index's position in it.
        unique_slots: (U,) int64 their slots at the lookup; ``token``: the table's
            ``mutations`` then (backward finds the keys again if it changed).
        batch: the table's ``begin_batch`` (ended by the backward).
    """

    tb: TableBatch
    unique: torch.Tensor
    unique_slots: torch.Tensor
    inverse: torch.Tensor
    token: int
    batch: Any


class BatchedDynamicEmbeddingTables(nn.Module):
    """Several dynamic tables looked up in one call, with a fused optimizer.

    Args:
        table_options: one DynamicEmbTableOptions per table (``dim`` and
            ``max_capacity`` required).
        feature_table_map: for each feature, the index of its table (several
            features may share a table).
        pooling_mode: SUM, MEAN, or NONE (sequence: one row per index; every table
            must then have the same dim).
        optimizer: EXACT_SGD (or SGD), EXACT_ADAGRAD, EXACT_ROWWISE_ADAGRAD, ADAM
            (``EmbOptimType``) or FTRL (``DynamicEmbOptimType``).
        learning_rate, eps, beta1, beta2, weight_decay: optimizer hyper-parameters
            (see dynemb.optimizer.OptimizerConfig); change them between steps with
            ``set_learning_rate`` or ``optimizer_config``.
        learning_rate_power, ftrl_beta, l1_reg, l2_reg, initial_accumulator_value:
            FTRL's (OptimizerConfig); ``initial_accumulator_value`` must be 0 with the
            other optimizers.
        table_names: one name per table, each used once (default ``table_0``, ...):
            messages, checkpoints and loads find a table by its name.
        device: where the tables live (default CPU).

    Raises:
        TypeError / ValueError: a bad argument, naming it and the value, before any table
            is built (e.g. ``table_names`` holding a name twice, with its positions).

    Admission: a table whose options set ``admit_strategy`` (with its counter) stores a
    new key only once the strategy admits it, cached or not (see dynemb.admission_strategies); its
    counter is ``admission_counters[t]`` (built with the counter's ``create``).

    Inputs follow fbgemm's TBE: ``forward(indices, offsets, per_sample_weights=None)``
    with feature-major ``indices`` and ``offsets`` of length ``B * T + 1``; a
    de-duplicated batch adds ``access_counts`` (how many accesses each index stands for).

    Example::

        >>> tables = BatchedDynamicEmbeddingTables(
        ...     [DynamicEmbTableOptions(dim=4, max_capacity=1024)], feature_table_map=[0, 0],
        ...     pooling_mode=DynamicEmbPoolingMode.SUM, optimizer=EmbOptimType.EXACT_SGD)
        >>> # 2 features x B=2 bags: f0 = [[10, 11], [12]], f1 = [[], [10]]
        >>> indices = torch.tensor([10, 11, 12, 10])
        >>> offsets = torch.tensor([0, 2, 3, 3, 4])
        >>> tables(indices, offsets).shape
        torch.Size([2, 8])
    """

    def __init__(
        self,
        table_options: Sequence[DynamicEmbTableOptions],
        feature_table_map: Sequence[int],
        pooling_mode: DynamicEmbPoolingMode = DynamicEmbPoolingMode.SUM,
        optimizer: OptimType = EmbOptimType.EXACT_SGD,
        learning_rate: float = 0.01,
        eps: float = 1e-8,
        beta1: float = 0.9,
        beta2: float = 0.999,
        weight_decay: float = 0.0,
        table_names: Sequence[str] | None = None,
        device: str | torch.device | None = None,
        learning_rate_power: float = -0.5,
        ftrl_beta: float = 0.0,
        l1_reg: float = 0.0,
        l2_reg: float = 0.0,
        initial_accumulator_value: float = 0.0,
    ) -> None:
        super().__init__()
        options = list(table_options)
        if not options:
            raise ValueError("table_options must hold at least one DynamicEmbTableOptions")
        fmap = [int(t) for t in feature_table_map]
        if not fmap or any(not 0 <= t < len(options) for t in fmap):
            raise ValueError(
                f"feature_table_map must map each feature to a table in [0, {len(options)}), got {fmap}"
            )
        if not isinstance(pooling_mode, DynamicEmbPoolingMode):
            raise TypeError(f"pooling_mode must be a DynamicEmbPoolingMode, got {pooling_mode!r}")
        config = OptimizerConfig(
            optimizer, learning_rate, eps, beta1, beta2, weight_decay,
            learning_rate_power, ftrl_beta, l1_reg, l2_reg, initial_accumulator_value,
        )  # fmt: skip
        config.validate()
        names = table_names_of(table_names, len(options))
        for name, o in zip(names, options):
            check_options(name, o)
        options = [with_kernel_defaults(name, o) for name, o in zip(names, options)]
        for name, o in zip(names, options):
            check_tiering_options(name, o, config.state_columns(o.dim))
            if o.warm_start is not None:
                check_source(name, o.warm_start, o.dim, config.state_columns(o.dim))
        dims = [o.dim for o in options]
        if pooling_mode == DynamicEmbPoolingMode.NONE and len(set(dims[t] for t in fmap)) > 1:
            raise ValueError(f"pooling_mode NONE needs one dim for every table, got dims {dims}")

        self.table_options = options
        self.feature_table_map = fmap
        self.pooling_mode = pooling_mode
        self.optimizer_config = config
        # Per table, its optimizer list's rounding: (stochastic_rounding, seed).
        self._rounding = [(o.stochastic_rounding, o.seed & _ROUNDING_SEED_MASK) for o in options]
        self.table_names = names
        self.dims = dims
        self.feature_dims = [dims[t] for t in fmap]
        self.device = canonical_device(device if device is not None else "cpu")
        # Per table, the output column of each of its features (in feature order): the
        # pooling op writes a table's bags straight there, and backward reads their
        # gradients there (no per-table temporaries, copies or concatenations).
        columns = _feature_columns(self.feature_dims)
        self._table_columns = [
            torch.tensor([columns[f][0] for f, tt in enumerate(fmap) if tt == t],
                         dtype=torch.int64, device=self.device)
            for t in range(len(options))
        ]  # fmt: skip
        # A ScoredHashTable, or a CachedTable in caching mode (dynemb.tiering): the
        # kernel uses them through the Table protocol only (never by their class).
        self.tables: list[Table] = [
            make_table(name, o, config.state_columns(o.dim), self.device, config.state_init(o.dim))
            for name, o in zip(names, options)
        ]
        # Rows of unknown keys in eval mode, resolved once (the op's init list per table).
        self._eval_missing = [
            init_list(o.eval_initializer_args, table) for o, table in zip(options, self.tables)
        ]
        # Each table counts in its own counter: the one in the options is a template
        # that several tables (or shards) may share.
        # A counter without a strategy is kept (dumped, loaded) but admits every key.
        self.admission_counters: list[Counter | None] = [
            None if (c := admission_counter_of(o)) is None else c.create(self.device)
            for o in options
        ]
        # Rows of keys not stored in training: the admission initializer's, else those an
        # unknown key reads in eval (a key that could not be stored is unknown).
        self._train_missing = [
            admission_missing(o.admit_strategy, table) if o.admit_strategy is not None else missing
            for o, table, missing in zip(options, self.tables, self._eval_missing)
        ]
        # Optimizer updates applied (Adam's bias correction uses it): from the dump whose
        # optimizer state the tables warm-start from, as a load restores it.
        self.step = carried_step(names, options, config.state_columns)
        # Per cached table: batch number -> (keys, distinct keys) of a prefetch, so that
        # the batch's forward reuses the de-duplication (and the table the slots).
        self._prefetched: list[dict[int, tuple]] = [{} for _ in options]
        # The training slots of a forward's keys, and the keys not stored (table_slots.py).
        self._lookups = TableSlots(self.tables, options, names, self.admission_counters)
        self._rules = StaleKeys(self.tables, options, names)  # eviction by rule (stale_keys.py)
        # How keys reach this rank, per table: (dist_type, num_embeddings). Set by the
        # row-wise sharded kernel (dynemb.shard.compute_kernel); checkpoints re-route with it.
        self.routing: list[tuple[str, int]] | None = None
        # Per table, the width of the whole table's rows (set by dynemb.shard); wider than
        # ``dims[t]`` for a column slice (columns ``[column_offset, column_offset + dim)``).
        self.full_dims: list[int] | None = None
        # fbgemm's trick: a zero-size leaf so that autograd calls our backward. Not an
        # nn.Parameter: model.parameters() (a dense optimizer's input) must not see the tables.
        self.placeholder_autograd_tensor = torch.zeros(0, device=self.device, requires_grad=True)

    # ------------------------------------------------------------------ API

    def table_routing(self, t: int) -> tuple[str, int]:
        """How keys of table ``t`` reach this rank: ``(dist_type, num_embeddings)``;
        ``("roundrobin", 0)`` for tables not sharded by dynemb.shard."""
        return self.routing[t] if self.routing is not None else ("roundrobin", 0)

    def set_learning_rate(self, lr: float) -> None:
        """Sets the learning rate used by the next backward (fbgemm TBE's hook).

        Raises:
            ValueError: ``lr`` is not a finite number >= 0 (a one-element tensor is
                read once, here).
        """
        value = hyper_parameter("learning_rate", lr)
        if not value >= 0:
            raise ValueError(f"learning_rate must be >= 0, got {value}")
        self.optimizer_config.learning_rate = value

    def get_learning_rate(self) -> float:
        return self.optimizer_config.learning_rate

    def flush(self) -> None:
        """Makes every spilled table's directory hold the table as it is now, so a
        module built with the same options reopens it (no-op for tables in memory)."""
        for table in self.tables:
            table.flush()

    def forward(
        self,
        indices: torch.Tensor,
        offsets: torch.Tensor,
        per_sample_weights: torch.Tensor | None = None,
        access_counts: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Looks a TBE batch up.

        Args:
            indices: (n,) int64 keys, feature-major.
            offsets: (B * T + 1,) int64 bag boundaries.
            per_sample_weights: (n,) float weights (SUM and MEAN pooling).
                Each of these tensors (and ``access_counts``) may be a strided view: it
                is read through a contiguous copy.
            access_counts: (n,) int64 >= 1, or None (one access per index): the
                accesses each index stands for, when the caller has de-duplicated keys
                (a sharded EC with ``use_index_dedup`` sends each distinct id once with
                its count). A table's distinct key is counted by the sum of its
                indices' counts: its LFU score and its admission counter grow by it, as
                if the index had been repeated that many times. Outputs, pooling and
                gradients do not read it.

        Returns:
            (B, sum of feature dims) float32 for SUM / MEAN; (n, dim) for NONE.

        Raises:
            TypeError, ValueError: a malformed argument, named in the message (before
                any table changes).

        Example::

            >>> # key 5 once, standing for 3 accesses: LFU counts it as [5, 5, 5]
            >>> tables(torch.tensor([5]), torch.tensor([0, 1]), access_counts=torch.tensor([3]))
        """
        batch_size, bounds = check_batch_layout(
            indices, offsets, per_sample_weights, len(self.feature_table_map), access_counts
        )
        if per_sample_weights is not None and self.pooling_mode == DynamicEmbPoolingMode.NONE:
            raise ValueError("per_sample_weights are not supported with pooling_mode NONE")
        for name, t in (("indices", indices), ("offsets", offsets)):
            if t.device != self.device:
                raise ValueError(f"{name} are on {t.device}, the tables are on {self.device}")
        indices, offsets, per_sample_weights, access_counts = contiguous_batch(
            indices, offsets, per_sample_weights, access_counts
        )
        lookup = functools.partial(self._lookup, bounds=bounds)
        if access_counts is not None:
            lookup = functools.partial(lookup, access_counts=access_counts.to(torch.int64))
        passes = (lookup, self._apply_gradients)
        return LookupFunction.apply(
            passes, indices, offsets, per_sample_weights, batch_size,
            self.placeholder_autograd_tensor,
        )  # fmt: skip

    def prefetch(
        self,
        indices: torch.Tensor,
        offsets: torch.Tensor,
        per_sample_weights: torch.Tensor | None = None,
        forward_stream=None,
    ) -> None:
        """Brings the keys of a future training batch into the caches (caching mode).

        Each cached table fetches the batch's keys from its slow tier and pins them
        until that batch's backward; the next training ``forward`` is that batch.
        Tables without caching ignore it. Call it for every batch, in order (e.g.
        from dynemb.tiering.PrefetchPipeline, which overlaps it with the compute
        of the previous batch); it may run in another thread than forward.

        On a GPU it may run on another stream than the forward (TorchRec's prefetch
        pipeline): each table's ops wait for the table's earlier ops on other streams
        (dynemb.table.stream_order), and ``forward_stream`` waits for this prefetch.

        Args:
            indices, offsets, per_sample_weights: the future batch, as in forward.
            forward_stream: None, or the stream the batch's forward runs on: its work
                queued from now on starts after this prefetch's, and what the
                prefetch keeps for the forward stays allocated until it is used.

        Raises:
            TypeError: ``forward_stream`` is not a stream of the tables' device.
        """
        streams.check_stream(self.device, forward_stream)
        batch_size, bounds = check_batch_layout(
            indices, offsets, per_sample_weights, len(self.feature_table_map)
        )
        indices, offsets, per_sample_weights = contiguous_batch(
            indices, offsets, per_sample_weights
        )
        batches = split_by_table(
            indices, offsets, per_sample_weights, self.feature_table_map, len(self.tables),
            batch_size, bounds=bounds,
        )  # fmt: skip
        cached = [
            tb if table.has_cache and self._inserts(t) else None
            for t, (table, tb) in enumerate(zip(self.tables, batches, strict=True))
        ]
        # Last table first: the forward then starts with the tables whose fills are
        # freshest in the CPU caches (a fill touches megabytes of rows per table).
        work = list(enumerate(zip(cached, distinct_keys(cached), strict=True)))
        kept: list[torch.Tensor] = []
        for t, (tb, distinct) in reversed(work):
            table = self.tables[t]
            if not table.has_cache or not self._inserts(t):
                continue
            keys = distinct[0] if tb is not None else indices[:0]
            if self._lookups.admits(t) and keys.numel():
                # only keys already stored: the forward's counter decides on the others
                keys = keys[table.contains(keys)]
            b = table.prefetch(keys)
            if tb is not None:
                pending = self._prefetched[t]
                pending[b] = (tb.keys, distinct)
                kept += [tb.keys, *distinct]
                while len(pending) > MAX_PENDING_PREFETCHES:  # retired, never consumed
                    del pending[min(pending)]
        streams.hand_over(self.device, forward_stream, kept)

    def cache_stats(self) -> list:
        """Per table: its dynemb.tiering.CacheStats (caching mode), else None."""
        return [t.cache_stats for t in self.tables]

    def telemetry(self) -> dict[str, TableTelemetry]:
        """Per table name: its TableTelemetry (dynemb.table.upsert_counts; a cached table's
        is its cache's). The dynemb.telemetry module gathers them over a model."""
        return {name: t.telemetry for name, t in zip(self.table_names, self.tables)}

    def dynamic_table_groups(self) -> tuple[tuple[str, "BatchedDynamicEmbeddingTables"], ...]:
        """This module itself: how dynemb.table_groups finds a group of tables in a model."""
        return (("", self),)

    def erase_stale(self, rule: EvictionRule | None = None) -> dict[str, int]:
        """Erases the stale keys of every table now, a whole pass each (keys of batches
        in flight are kept); a scheduled pass under way is finished by it.

        Args:
            rule: the rule for every table; None: each table's ``eviction_rule``
                (tables without one are skipped).

        Returns:
            ``{table name: keys erased}`` for the tables the rule ran on.

        Raises:
            TypeError: ``rule`` not an EvictionRule; ValueError: a predicate a table's
                score strategy cannot decide (checked for every table first: nothing
                is erased).
        """
        return self._rules.erase_stale(rule)

    @property
    def erased_by_rule(self) -> list[ErasedKeys]:
        """Per table: the keys it erased by rule (dynemb.eviction_rules.erased_since)."""
        return self._rules.erased_by_rule

    @property
    def safe_check_failures(self) -> list[int]:
        """Keys not stored by training lookups, per table, cumulative."""
        return self._lookups.safe_check_failures

    @property
    def lookup_outcomes(self) -> list[tuple[int, int, int, int] | None]:
        """Per table, the last forward's training lookup counts (hits, inserted,
        evicted, failed), summed over its lookup calls; None for a table that forward
        did not look up in training, or whose counts are read later (a grouped lookup
        of tables all in safe_check_mode IGNORE that cannot grow). Column slices
        compare them (dynemb.shard.slice_agreement)."""
        return self._lookups.lookup_outcomes

    # --------------------------------------------------------------- forward

    def _lookup(self, indices, offsets, weights, batch_size, access_counts=None, bounds=None):
        """Forward without autograd: returns (output, (trains, per-table TableForward or
        None)). ``trains``: this forward's module mode, which decides what its backward
        does. ``access_counts``: (n,) int64 or None, as in ``forward``; ``bounds``: the
        features' first indices (``check_batch_layout``'s; None: read from ``offsets``)."""
        self._lookups.start_forward(self.training)
        if self.training:  # before this batch's lookups: the rule's chunk of this step
            self._rules.scheduled_erase()
        # 1. The keys are read during this forward only (its backward reads the offsets
        # and weights): a copy of them would cost a pass over the batch for nothing.
        batches = split_by_table(
            indices, offsets, weights, self.feature_table_map, len(self.tables), batch_size,
            copy_keys=False, bounds=bounds,
        )  # fmt: skip
        distincts = self._distinct(batches, access_counts)
        holds = self._begin_batches(batches)  # 2.
        try:  # 3. and 4.
            slots = self._slots(batches, distincts, holds)
            reads = [
                None if s is None else self._rows_read(t, distincts[t][0], s[0], holds[t])
                for t, s in enumerate(slots)
            ]
            out = self._pool(indices.numel(), batch_size, batches, distincts, reads)
        except BaseException:  # no backward will end them
            self._end_batches(holds)
            raise
        saved = [
            None if hold is None else TableForward(tb, d[0], s[0], d[1], s[1], hold)
            for tb, d, s, hold in zip(batches, distincts, slots, holds, strict=True)
        ]
        return out, (self.training, saved)

    def _distinct(self, batches: list, access_counts: torch.Tensor | None = None) -> list:
        """``unique_keys`` of each table's keys (None for absent tables); a training
        batch whose keys a table prefetched reuses the prefetch's result. With
        ``access_counts``, each distinct key's count is the sum of its indices' counts.

        When a table's training lookup reads the device anyway (``takes_padded_keys``:
        a cache's claim), the tables' keys are de-duplicated without a read
        (``PaddedKeys``): ``_slots`` runs those lookups first, and their read takes the
        counts of every table along."""
        reused = [None] * len(batches)
        for t, tb in enumerate(batches):
            if tb is None or not self._inserts(t):
                continue
            b = self.tables[t].upcoming_batch()
            entry = self._prefetched[t].pop(b, None) if b is not None else None
            if entry is not None and torch.equal(entry[0], tb.keys):
                reused[t] = entry[1]
                streams.used_here(entry[1])  # made on the prefetch's stream
        fresh = [tb if r is None else None for tb, r in zip(batches, reused)]
        padded = access_counts is None and any(
            tb is not None and self._lookups.takes_padded_keys(t) for t, tb in enumerate(fresh)
        )
        fresh = distinct_keys(fresh, padded)
        distincts = [r if r is not None else f for r, f in zip(reused, fresh)]
        if access_counts is None:
            return distincts
        return [
            None if d is None else count_accesses(d, tb, access_counts)
            for d, tb in zip(distincts, batches, strict=True)
        ]

    def _begin_batches(self, batches: list) -> list:
        """Each table this forward trains begins a batch (None for the others), in
        flight until the backward (or until the graph is dropped unused): no other
        batch evicts its keys meanwhile. A table without keys in it skips one."""
        holds = []
        for t, tb in enumerate(batches):
            hold = None
            if self._inserts(t):
                if tb is None:
                    self.tables[t].skip_batch()
                else:
                    hold = self.tables[t].begin_batch()
            holds.append(hold)
        return holds

    def _end_batches(self, holds: list) -> None:
        """Ends the batches of ``holds`` (None: none begun), every one even if one raises."""
        errors = []
        for table, hold in zip(self.tables, holds, strict=True):
            if hold is not None:
                try:
                    table.end_batch(hold)
                except BaseException as error:  # the others must end all the same
                    errors.append(error)
        if errors:
            raise errors[0]

    def _slots(self, batches: list, distincts: list, holds: list) -> list:
        """Per table ``(unique_slots, mutation count)`` of its distinct keys (None for
        absent tables): training lookups (those that can share one op call in one),
        or ``eval_rows``' slots for a table this forward does not train.

        Padded distinct keys (``_distinct``) are looked up first by the tables that
        take them; then every table's are sized in ``distincts`` (in place), their
        count read with those lookups' read."""
        trained = [t for t, hold in enumerate(holds) if hold is not None]
        early = {
            t: self._lookups.table_slots(t, distincts[t], None, holds[t])
            for t in trained
            if isinstance(distincts[t], PaddedKeys) and self._lookups.takes_padded_keys(t)
        }
        for t, d in enumerate(distincts):
            if isinstance(d, PaddedKeys):
                distincts[t] = d.sized()
        found = self._lookups.grouped_slots(trained, distincts, holds) if trained else {}
        found.update(early)
        slots = []
        for t, (tb, d) in enumerate(zip(batches, distincts, strict=True)):
            if tb is None or holds[t] is None:
                slots.append(None if tb is None else (None, None))
            elif t in found:
                slots.append(found[t])
            else:
                slots.append(self._lookups.table_slots(t, d[0], d[2], holds[t]))
        return slots

    def _rows_read(self, t: int, unique: torch.Tensor, slots, hold) -> tuple:
        """Where table t's rows are read: ``(storage or None, slots, missing)``; None
        stands for the table's ``buffers`` under its lock; ``missing``: the init list
        of keys without a row."""
        table = self.tables[t]
        if hold is None:
            storage, slots = table.eval_rows(unique)
            return storage, slots, self._eval_missing[t]
        storage, slots = table.batch_rows(slots, hold)
        return storage, slots, self._train_missing[t]

    def _pool(self, n: int, batch_size: int, batches, distincts, reads) -> torch.Tensor:
        """The output: every present table's bags pooled into their features' columns
        in one grouped call, or (NONE) one row per index in the features' rows."""
        present = [t for t, tb in enumerate(batches) if tb is not None]
        if self.pooling_mode != DynamicEmbPoolingMode.NONE:
            out = torch.empty((batch_size, sum(self.feature_dims)), device=self.device)
            grouped = [
                (t, batches[t], *reads[t][:2], distincts[t][1], reads[t][2]) for t in present
            ]
            pool_grouped(self, self._table_columns, grouped, POOLING_CODE[self.pooling_mode], out)
            return out
        out = torch.empty((n, self.dims[self.feature_table_map[0]]), device=self.device)
        for t in present:
            tb, (storage, slots, missing) = batches[t], reads[t]
            table = self.tables[t]
            with table_locked(table, storage, write=False):
                tensors = (table.buffers if storage is None else storage).tensors()
                rows = _ops.embedding_gather(
                    tensors, slots[distincts[t][1]], tb.keys, missing,
                    self.table_options[t].seed, table.dim,
                )  # fmt: skip
            start = 0
            for a, b in tb.index_ranges:
                out[a:b] = rows[start : start + b - a]
                start += b - a
        return out

    # -------------------------------------------------------------- backward

    def _apply_gradients(self, saved, grad_out: torch.Tensor, batch_size: int) -> bool:
        """Backward: one fused optimizer update per distinct key of each table the
        forward trained (its mode then, not now); returns whether it was a training
        forward (then the step advanced)."""
        trains, saved = saved
        if not trains:
            return False
        try:
            self._update_rows(saved, grad_out)
        finally:  # the rows are written: the keys may be evicted again
            self._end_batches([None if e is None else e.batch for e in saved])
        return True

    def _update_rows(self, saved: list, grad_out: torch.Tensor) -> None:
        """``_apply_gradients``' updates of the tables ``saved`` (a training forward's)."""
        # validates: raises before any change. Per table: its rounding of 16-bit rows.
        optimizers = self.optimizer_config.kernel_args_of_tables(self._rounding)
        grad_out = grad_out.to(torch.float32)
        self.step += 1
        entries = [(t, e) for t, e in enumerate(saved) if e is not None]
        if self.pooling_mode != DynamicEmbPoolingMode.NONE:  # one op call for all
            grouped = [(t, e.tb, e.unique, e.unique_slots, e.inverse, e.token) for t, e in entries]
            pooling = POOLING_CODE[self.pooling_mode]
            backward_grouped(self, self._table_columns, grouped, pooling, grad_out, optimizers)
        for t, e in entries:
            table = self.tables[t]
            staged = table.staged_rows(e.batch)
            if staged is None and self.pooling_mode != DynamicEmbPoolingMode.NONE:
                continue
            grad = self._grad_args(t, e, grad_out)
            if self.pooling_mode == DynamicEmbPoolingMode.NONE:
                with table.lock.write():
                    slots = e.unique_slots
                    if table.mutations != e.token:  # keys moved since forward: find them again
                        slots = _ops.table_find_slots(table.buffers.tensors(), e.unique)
                    _ops.embedding_backward(
                        table.buffers.tensors(), slots, e.inverse, *grad[:4], optimizers[t],
                        self.step, table.dim, grad[4],
                    )  # fmt: skip
            if staged is not None:  # keys held outside the buffers: the same update
                storage, slots = staged
                _ops.embedding_backward(
                    storage.tensors(), slots, e.inverse, *grad[:4], optimizers[t], self.step,
                    table.dim, grad[4],
                )  # fmt: skip

    def _grad_args(self, t: int, e: TableForward, grad_out: torch.Tensor) -> tuple:
        """``(offsets, weights, pooling mode, gradient, gradient columns)`` of table t's
        bags as embedding_backward takes them."""
        if self.pooling_mode == DynamicEmbPoolingMode.NONE:
            grad = torch.cat([grad_out[a:b] for a, b in e.tb.index_ranges]).contiguous()
            offsets = torch.arange(e.tb.keys.numel() + 1, device=self.device)
            return offsets, None, 0, grad, None
        # the op reads each feature's gradient in place in grad_out's columns
        mode = POOLING_CODE[self.pooling_mode]
        return e.tb.offsets, e.tb.weights, mode, grad_out, self._table_columns[t]

    # -------------------------------------------------------------- internals

    def _inserts(self, t: int) -> bool:
        return self.training and self.table_options[t].training


# The rounding seed crosses the op boundary as a float: its low 53 bits.
_ROUNDING_SEED_MASK = (1 << 53) - 1


def _feature_columns(dims):
    cols, start = [], 0
    for d in dims:
        cols.append((start, start + d))
        start += d
    return cols


__all__ = ["BatchedDynamicEmbeddingTables", "TableBatch"]
