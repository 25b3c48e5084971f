"""The backward of BatchedDynamicEmbeddingTables: one fused optimizer update per
distinct key of each table the forward trained, in place, the same for every table
(the Table protocol, dynemb/table/protocol.py):

1. the rows in each table's ``buffers`` (one grouped op call when pooled; the slots
   found again in a table whose keys moved since the forward);
2. the rows a batch holds outside them (``staged_rows``: a cache's staged keys);
3. every table's ``end_batch``, even when an update raised.

``BackwardPass`` is a part of BatchedDynamicEmbeddingTables (it uses its ``tables``,
``optimizer_config``, ``pooling_mode``, ``device``, ``step`` and ``_end_batches``).
"""

import torch

from dynemb import _ops
from dynemb.config.types import DynamicEmbPoolingMode
from dynemb.tbe.forward_pass import POOLING_CODE, TableForward
from dynemb.tbe.grouped_calls import backward_grouped


class BackwardPass:
    """The backward's updates (a part of BatchedDynamicEmbeddingTables)."""

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
        optimizers = [self.optimizer_config.kernel_args(*r) for r in self._rounding]
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
