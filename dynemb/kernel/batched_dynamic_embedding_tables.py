"""``BatchedDynamicEmbeddingTables``: the dynamic counterpart of fbgemm's TBE.

Forward looks each table's keys up (inserting new keys in training), pools them
(SUM / MEAN) or returns one row per index (NONE). Backward reduces the output
gradient to one gradient per distinct key of each table and applies the fused
optimizer to those rows in place: no dense gradient and no autograd leaf exist
for the tables. The per-element maths is in csrc/core (pooling.h,
optimizer_rules.h).
"""

import functools
from collections.abc import Sequence

import torch
from torch import nn

from dynemb import _ops
from dynemb.admission import Counter
from dynemb.dynamicemb_config import (
    DynamicEmbTableOptions,
    init_mode_code,
    with_kernel_defaults,
)
from dynemb.kernel.batch_layout import (
    TableBatch,
    check_access_counts,
    check_batch,
    contiguous_batch,
    count_accesses,
    distinct_keys,
    split_by_table,
)
from dynemb.kernel.grouped_calls import backward_grouped, pool_grouped
from dynemb.kernel.lookup_function import LookupFunction
from dynemb.kernel.table_options import (
    admission_missing,
    check_options,
    init_list,
    table_names_of,
)
from dynemb.kernel.table_slots import TableSlots
from dynemb.optimizer import EmbOptimType, OptimizerConfig, hyper_parameter
from dynemb.table.placement import canonical_device
from dynemb.table.protocol import Table
from dynemb.tiering.batch_ledger import MAX_PENDING_PREFETCHES
from dynemb.tiering.cached_table import CachedTable
from dynemb.tiering.factory import check_tiering_options, make_table
from dynemb.tiering.staging import private_table
from dynemb.types import DynamicEmbInitializerMode, DynamicEmbPoolingMode

_ZEROS = [float(init_mode_code(DynamicEmbInitializerMode.CONSTANT)), 0.0, 0.0, 0.0, 0.0, 0.0]
_POOLING_CODE = {
    mode: _ops.POOLING_CODES[mode.name]
    for mode in (DynamicEmbPoolingMode.SUM, DynamicEmbPoolingMode.MEAN)
}


class BatchedDynamicEmbeddingTables(TableSlots, nn.Module):
    """Several dynamic tables looked up in one call, with a fused optimizer.

    Args:
        table_options: one DynamicEmbTableOptions per table (``dim`` and
            ``max_capacity`` required).
        feature_table_map: for each feature, the index of its table (several
            features may share a table).
        pooling_mode: SUM, MEAN, or NONE (sequence: one row per index; every table
            must then have the same dim).
        optimizer: EXACT_SGD (or SGD), EXACT_ADAGRAD, EXACT_ROWWISE_ADAGRAD or ADAM.
        learning_rate, eps, beta1, beta2, weight_decay: optimizer hyper-parameters
            (see dynemb.optimizer.OptimizerConfig); change them between steps with
            ``set_learning_rate`` or ``optimizer_config``.
        table_names: one name per table, each used once (default ``table_0``, ...):
            messages, checkpoints and loads find a table by its name.
        device: where the tables live (default CPU).

    Raises:
        TypeError / ValueError: a bad argument, naming it and the value, before any table
            is built (e.g. ``table_names`` holding a name twice, with its positions).

    Admission: a table whose options set ``admit_strategy`` and ``admission_counter``
    stores a new key only once the strategy admits it (see dynemb.admission); its
    counter is ``admission_counters[t]`` (built with ``admission_counter.create``).

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
        optimizer: EmbOptimType = EmbOptimType.EXACT_SGD,
        learning_rate: float = 0.01,
        eps: float = 1e-8,
        beta1: float = 0.9,
        beta2: float = 0.999,
        weight_decay: float = 0.0,
        table_names: Sequence[str] | None = None,
        device: str | torch.device | None = None,
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
        config = OptimizerConfig(optimizer, learning_rate, eps, beta1, beta2, weight_decay)
        config.validate()
        names = table_names_of(table_names, len(options))
        for name, o in zip(names, options):
            check_options(name, o)
        options = [with_kernel_defaults(name, o) for name, o in zip(names, options)]
        for name, o in zip(names, options):
            check_tiering_options(name, o, config.state_columns(o.dim))
        dims = [o.dim for o in options]
        if pooling_mode == DynamicEmbPoolingMode.NONE and len(set(dims[t] for t in fmap)) > 1:
            raise ValueError(f"pooling_mode NONE needs one dim for every table, got dims {dims}")

        self.table_options = options
        self.feature_table_map = fmap
        self.pooling_mode = pooling_mode
        self.optimizer_config = config
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
        # kernel uses them through the Table protocol only.
        self.tables: list[Table] = [
            make_table(name, o, config.state_columns(o.dim), self.device)
            for name, o in zip(names, options)
        ]
        # Rows of unknown keys in eval mode, resolved once (the op's init list per table).
        self._eval_missing = [
            init_list(o.eval_initializer_args, table) for o, table in zip(options, self.tables)
        ]
        # Each table counts in its own counter: the one in the options is a template
        # that several tables (or shards) may share.
        self.admission_counters: list[Counter | None] = [
            o.admission_counter.create(self.device) if o.admit_strategy is not None else None
            for o in options
        ]
        # Rows of keys not stored in training: the admission initializer's, else those an
        # unknown key reads in eval (a key that could not be stored is unknown).
        self._train_missing = [
            admission_missing(o.admit_strategy, table) if o.admit_strategy is not None else missing
            for o, table, missing in zip(options, self.tables, self._eval_missing)
        ]
        self.step = 0  # optimizer updates applied (Adam's bias correction uses it)
        # Per cached table: batch number -> (keys, distinct keys) of a prefetch, so that
        # the batch's forward reuses the de-duplication (and the table the slots).
        self._prefetched: list[dict[int, tuple]] = [{} for _ in options]
        self.safe_check_failures = [0] * len(options)  # keys not stored, per table, cumulative
        # How keys reach this rank, per table: (dist_type, num_embeddings). Set by the
        # row-wise sharded kernel (dynemb.shard.kernel); checkpoints re-route with it.
        self.routing: list[tuple[str, int]] | None = None
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
        batch_size = check_batch(indices, offsets, per_sample_weights, len(self.feature_table_map))
        check_access_counts(access_counts, indices)
        if per_sample_weights is not None and self.pooling_mode == DynamicEmbPoolingMode.NONE:
            raise ValueError("per_sample_weights are not supported with pooling_mode NONE")
        for name, t in (("indices", indices), ("offsets", offsets)):
            if t.device != self.device:
                raise ValueError(f"{name} are on {t.device}, the tables are on {self.device}")
        indices, offsets, per_sample_weights, access_counts = contiguous_batch(
            indices, offsets, per_sample_weights, access_counts
        )
        lookup = self._lookup
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
    ) -> None:
        """Brings the keys of a future training batch into the caches (caching mode).

        Each cached table fetches the batch's keys from its slow tier and pins them
        until that batch's backward; the next training ``forward`` is that batch.
        Tables without caching ignore it. Call it for every batch, in order (e.g.
        from dynemb.tiering.PrefetchPipeline, which overlaps it with the compute
        of the previous batch); it may run in another thread than forward.

        Args:
            indices, offsets, per_sample_weights: the future batch, as in forward.
        """
        batch_size = check_batch(indices, offsets, per_sample_weights, len(self.feature_table_map))
        indices, offsets, per_sample_weights = contiguous_batch(
            indices, offsets, per_sample_weights
        )
        batches = split_by_table(
            indices, offsets, per_sample_weights, self.feature_table_map, len(self.tables),
            batch_size,
        )  # fmt: skip
        cached = [
            tb if isinstance(table, CachedTable) and self._inserts(t) else None
            for t, (table, tb) in enumerate(zip(self.tables, batches, strict=True))
        ]
        # Last table first: the forward then starts with the tables whose fills are
        # freshest in the CPU caches (a fill touches megabytes of rows per table).
        work = list(enumerate(zip(cached, distinct_keys(cached), strict=True)))
        for t, (tb, distinct) in reversed(work):
            table = self.tables[t]
            if not isinstance(table, CachedTable) or not self._inserts(t):
                continue
            b = table.prefetch(distinct[0] if tb is not None else indices[:0])
            if tb is not None:
                pending = self._prefetched[t]
                pending[b] = (tb.keys, distinct)
                while len(pending) > MAX_PENDING_PREFETCHES:  # retired, never consumed
                    del pending[min(pending)]

    def cache_stats(self) -> list:
        """Per table: its dynemb.tiering.CacheStats (caching mode), else None."""
        return [t.stats if isinstance(t, CachedTable) else None for t in self.tables]

    # -------------------------------------------------------------- internals

    def _lookup(self, indices, offsets, weights, batch_size, access_counts=None):
        """Forward without autograd: returns (output, (trains, per-table saved state)).
        ``trains``: this forward's module mode, which decides what its backward does.
        ``access_counts``: (n,) int64 or None, as in ``forward``."""
        self._start_forward()
        # The keys are read during this forward only (its backward reads the offsets and
        # weights): a copy of them would cost a pass over the batch for nothing.
        batches = split_by_table(
            indices, offsets, weights, self.feature_table_map, len(self.tables), batch_size,
            copy_keys=False,
        )  # fmt: skip
        sequence = self.pooling_mode == DynamicEmbPoolingMode.NONE
        if sequence:
            out = torch.empty(
                (indices.numel(), self.dims[self.feature_table_map[0]]), device=self.device
            )
        else:
            out = torch.empty((batch_size, sum(self.feature_dims)), device=self.device)
        saved = []
        grouped = []  # (t, batch, unique_slots, inverse, missing): pooled in one call, below
        distincts = self._distinct(batches, access_counts)
        # Each table in memory that this forward trains pins the keys it looks up until
        # the backward has written their rows (released then, or when the graph is
        # dropped unused): no other batch may evict them meanwhile.
        holds = [
            self.tables[t].hold_pins() if tb is not None and self._pins_keys(t) else None
            for t, tb in enumerate(batches)
        ]
        # The training lookups of the tables in memory: one op call for all of them.
        present = [t for t, tb in enumerate(batches) if tb is not None]
        found = self._grouped_slots(present, distincts, holds) if self.training else {}
        for t, (tb, distinct) in enumerate(zip(batches, distincts, strict=True)):
            table = self.tables[t]
            cached = isinstance(table, CachedTable)
            if tb is None:
                if cached and self._inserts(t):  # keep batch numbers in step with prefetch
                    table.end_batch(table.begin_batch())
                saved.append(None)
                continue
            unique, inverse, counts = distinct
            into = None if sequence else (out, self._table_columns[t])  # pooled: in place
            if cached and not self._inserts(t):
                rows = self._cached_eval_rows(t, tb, unique, inverse, batch_size, into)
                batch = None
            else:
                batch = staged = None
                if cached:  # training: cache slots, and the keys it could not take; the
                    # batch stays in flight until this forward's backward (or dropped graph)
                    batch = table.begin_batch()
                    unique_slots, staged = table.lookup(unique, counts, batch)
                    token = table.mutations
                elif t in found:
                    unique_slots, token = found[t]
                else:
                    unique_slots, token = self._training_slots(t, unique, counts, holds[t])
                missing = self._train_missing[t] if self._inserts(t) else self._eval_missing[t]
                if into is not None and not cached:
                    grouped.append((t, tb, unique_slots, inverse, missing))
                elif staged is not None:  # some rows in the cache, the rest staged:
                    with table.lock.read():  # pooled together, in one pass
                        rows_of = staged.batch_rows(table.buffers, unique_slots)
                    rows = self._read_rows(t, tb, inverse, _ZEROS, batch_size, rows_of, into)
                else:
                    slots = unique_slots[inverse]
                    with table.lock.read():
                        rows = self._read_rows(t, tb, slots, missing, batch_size, into=into)
            if sequence:
                start = 0
                for a, b in tb.index_ranges:
                    out[a:b] = rows[start : start + b - a]
                    start += b - a
            saved.append(None if not self._inserts(t) else
                         (tb, unique, unique_slots, inverse, token, batch, staged, holds[t]))  # fmt: skip
        pool_grouped(self, self._table_columns, grouped, _POOLING_CODE.get(self.pooling_mode), out)
        return out, (self.training, saved)

    def _distinct(self, batches: list, access_counts: torch.Tensor | None = None) -> list:
        """``unique_keys`` of each table's keys (None for absent tables); a cached
        table's batch whose keys were prefetched reuses the prefetch's result. With
        ``access_counts``, each distinct key's count is the sum of its indices' counts."""
        reused = [None] * len(batches)
        for t, tb in enumerate(batches):
            table = self.tables[t]
            if tb is None or not isinstance(table, CachedTable) or not self._inserts(t):
                continue
            b = table.upcoming_batch()
            entry = self._prefetched[t].pop(b, None) if b is not None else None
            if entry is not None and torch.equal(entry[0], tb.keys):
                reused[t] = entry[1]
        fresh = distinct_keys([tb if r is None else None for tb, r in zip(batches, reused)])
        distincts = [r if r is not None else f for r, f in zip(reused, fresh)]
        if access_counts is None:
            return distincts
        return [
            None if d is None else count_accesses(d, tb, access_counts)
            for d, tb in zip(distincts, batches, strict=True)
        ]

    def _cached_eval_rows(self, t, tb, unique, inverse, batch_size, into=None):
        """Eval lookup of a cached table: rows from the cache, else its slow tier, else
        the eval initializer, pooled by the same op as every lookup (core/pooling.h);
        nothing is inserted. The stored rows go to a private table for the op."""
        stored, found = self.tables[t].read_rows(unique)
        at = torch.nonzero(found, as_tuple=True)[0]
        unique_slots = torch.full_like(unique, -1)
        unique_slots[at] = torch.arange(at.numel(), device=unique.device)
        storage = private_table(stored[at])
        missing = self._eval_missing[t]
        return self._read_rows(t, tb, unique_slots[inverse], missing, batch_size, storage, into)

    def _read_rows(self, t, tb, slots, missing, batch_size, storage=None, into=None):
        """Pooled bags (len(features) * B, dim), or one row per index for NONE.
        ``storage``: the TableStorage to read (default: table t's). ``into``: (out,
        columns): the pooled bags are written in the features' columns of ``out``
        (embedding_pool_into) and None is returned."""
        table, opts = self.tables[t], self.table_options[t]
        storage = (storage or table.buffers).tensors()
        if self.pooling_mode == DynamicEmbPoolingMode.NONE:
            return _ops.embedding_gather(storage, slots, tb.keys, missing, opts.seed, table.dim)
        if into is not None:
            _ops.embedding_pool_into(
                storage, slots, tb.keys, tb.offsets, tb.weights, _POOLING_CODE[self.pooling_mode],
                missing, opts.seed, table.dim, *into,
            )  # fmt: skip
            return None
        return _ops.embedding_pool(
            storage, slots, tb.keys, tb.offsets, tb.weights, _POOLING_CODE[self.pooling_mode],
            missing, opts.seed, table.dim,
        )  # fmt: skip

    def _training_slots(self, t: int, unique: torch.Tensor, counts: torch.Tensor, hold=None):
        """``_table_slots``, announced to the table's change log first when the backward
        will write the rows: a delta's pre-capture may seal the log's keys at the
        announcement, never between the lookup's records (it records the keys, then the
        residents it evicted) nor between them and the backward's writes."""
        log = self.tables[t].change_log if self._inserts(t) else None
        if log is None:
            return self._table_slots(t, unique, counts, hold)
        log.begin_writes()
        try:
            return self._table_slots(t, unique, counts, hold)
        except BaseException:
            log.end_writes()  # no backward will write them
            raise

    def _inserts(self, t: int) -> bool:
        return self.training and self.table_options[t].training

    def _pins_keys(self, t: int) -> bool:
        """Whether this forward holds pins in table t until its backward: a table in
        memory that it trains (a cache pins by its own batch numbers)."""
        return self._inserts(t) and not isinstance(self.tables[t], CachedTable)

    def _apply_gradients(self, saved, grad_out: torch.Tensor, batch_size: int) -> bool:
        """Backward: one fused optimizer update per distinct key of each table the
        forward trained (its mode then, not now); returns whether it was a training
        forward (then the step advanced)."""
        trains, saved = saved
        if not trains:
            return False
        try:
            self._update_rows(saved, grad_out)
        finally:
            for t, entry in enumerate(saved):  # the rows its lookups recorded are written
                if entry is not None and entry[5] is None:  # not cached: a ScoredHashTable
                    log = self.tables[t].change_log
                    if log is not None:
                        log.end_writes()
                if entry is not None and entry[7] is not None:
                    entry[7].release()  # its keys may be evicted again
        return True

    def _update_rows(self, saved: list, grad_out: torch.Tensor) -> None:
        """``_apply_gradients``' updates of the tables ``saved`` (a training forward's)."""
        optimizer = self.optimizer_config.kernel_args()  # validates: raises before any change
        grad_out = grad_out.to(torch.float32)
        self.step += 1
        sequence = self.pooling_mode == DynamicEmbPoolingMode.NONE
        if not sequence:  # tables in memory (no cache batch): one op call for all
            in_memory = {t for t, e in enumerate(saved) if e is not None and e[5] is None}
            entries = [(t, *saved[t][:5]) for t in sorted(in_memory)]
            pooling = _POOLING_CODE[self.pooling_mode]
            backward_grouped(self, self._table_columns, entries, pooling, grad_out, optimizer)
            saved = [None if t in in_memory else e for t, e in enumerate(saved)]
        for t, entry in enumerate(saved):
            if entry is None:
                continue
            tb, unique, unique_slots, inverse, token, batch, staged, _ = entry
            table = self.tables[t]
            if sequence:
                grad = torch.cat([grad_out[a:b] for a, b in tb.index_ranges]).contiguous()
                offsets = torch.arange(tb.keys.numel() + 1, device=self.device)
                weights, mode, grad_columns = None, 0, None
            else:  # the op reads each feature's gradient in place in grad_out's columns
                grad, grad_columns = grad_out, self._table_columns[t]
                offsets, weights = tb.offsets, tb.weights
                mode = _POOLING_CODE[self.pooling_mode]
            with table.lock.write():
                if table.mutations != token:  # keys moved since forward: find them again
                    unique_slots = _ops.table_find_slots(table.buffers.tensors(), unique)
                _ops.embedding_backward(
                    table.buffers.tensors(), unique_slots, inverse, offsets, weights, mode,
                    grad, optimizer, self.step, table.dim, grad_columns,
                )  # fmt: skip
            if staged is not None:  # keys the cache could not take: the same update
                _ops.embedding_backward(
                    staged.storage.tensors(), staged.unique_slots, inverse, offsets, weights,
                    mode, grad, optimizer, self.step, table.dim, grad_columns,
                )  # fmt: skip
            if batch is not None:  # its rows may leave the cache, its staged rows go home
                table.end_batch(batch)


def _feature_columns(dims):
    cols, start = [], 0
    for d in dims:
        cols.append((start, start + d))
        start += d
    return cols


__all__ = ["BatchedDynamicEmbeddingTables", "TableBatch"]
