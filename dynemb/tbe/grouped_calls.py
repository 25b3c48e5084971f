"""The TBE module's grouped op calls: the pooling and the backward of every table of a
batch in one executor call (one per value dtype, usually one in all), under the
locks of the tables whose buffers they address, taken in table order (two modules
sharing tables take them alike).

Functions of a BatchedDynamicEmbeddingTables ``module`` (they use its ``tables``,
``table_options`` and ``step``); ``columns[t]``: table t's features' output columns.
"""

import contextlib

import torch

from dynemb import _ops


def pool_grouped(module, columns, grouped: list, pooling: int, out: torch.Tensor) -> None:
    """Pools the bags of the tables of ``grouped``, (t, TableBatch, storage, unique_slots,
    inverse, missing) each, into their features' columns of ``out`` (pooling: the op's
    mode code); index i of a table pools the row of ``unique_slots[inverse[i]]`` in
    ``storage`` (None: the table's ``buffers``, read under its lock)."""
    for group in _by_value_dtype(grouped, module.tables, lambda item: item[2]):
        ts, batches, storages, unique_slots, inverse, missing = zip(*group, strict=True)
        tables = [module.tables[t] for t in ts]
        locks = [table.lock.read for table, s in zip(tables, storages) if s is None]
        with _all_locked(locks):
            read = [table.buffers if s is None else s for table, s in zip(tables, storages)]
            _ops.embedding_pool_into_grouped(
                [s.tensors() for s in read], list(unique_slots), [tb.keys for tb in batches], [tb.offsets for tb in batches],
                _weights(batches), pooling, list(missing),
                [module.table_options[t].seed for t in ts], [table.dim for table in tables],
                out, [columns[t] for t in ts], inverse=list(inverse),
            )  # fmt: skip


def backward_grouped(module, columns, entries: list, pooling: int, grad_out, optimizers) -> None:
    """The fused backward of the tables of ``entries``, (t, TableBatch, unique keys,
    their slots, inverse, mutation count at forward) each: slots are found again in a
    table whose keys moved since. ``optimizers[t]``: table t's optimizer list; one op
    call takes the tables of one value dtype and one list."""
    parts = _by_value_dtype(entries, module.tables)
    groups: dict = {}
    for part in parts:
        for item in part:
            groups.setdefault((id(part), tuple(optimizers[item[0]])), []).append(item)
    for group in groups.values():
        optimizer = optimizers[group[0][0]]
        ts, batches, unique, unique_slots, inverse, tokens = zip(*group, strict=True)
        tables = [module.tables[t] for t in ts]
        with _all_locked([table.lock.write for table in tables]):
            slots = [
                _ops.table_find_slots(table.buffers.tensors(), keys)
                if table.mutations != token else found
                for table, keys, found, token in zip(tables, unique, unique_slots, tokens)
            ]  # fmt: skip
            _ops.embedding_backward_grouped(
                [table.buffers.tensors() for table in tables], slots, list(inverse),
                [tb.offsets for tb in batches], _weights(batches), pooling, grad_out,
                optimizer, module.step, [table.dim for table in tables],
                [columns[t] for t in ts],
            )  # fmt: skip


def _weights(batches) -> list | None:
    """Per-sample weights come with every table's batch or with none."""
    return None if batches[0].weights is None else [tb.weights for tb in batches]


def table_locked(table, storage, write: bool):
    """``table``'s lock (write or read) when ``storage`` is None (the op addresses the
    table's ``buffers``), else nothing (a private storage)."""
    if storage is not None:
        return contextlib.nullcontext()
    return table.lock.write() if write else table.lock.read()


def _by_value_dtype(items: list, tables: list, storage_of=lambda item: None) -> list:
    """``items`` (tuples starting with a table index) split by the value dtype of the
    storage each addresses (``storage_of(item)``, None: its table's buffers), in table
    order within each part: a grouped op takes tables of one dtype."""
    parts: dict = {}
    for item in items:
        storage = storage_of(item)
        storage = tables[item[0]].buffers if storage is None else storage
        parts.setdefault(storage.values.dtype, []).append(item)
    return list(parts.values())


@contextlib.contextmanager
def _all_locked(locks: list):
    """Holds every lock of ``locks`` (context manager factories), taken in list order."""
    with contextlib.ExitStack() as stack:
        for lock in locks:
            stack.enter_context(lock())
        yield
