"""The lookup of an inference module's batch (dynemb/inference/exportable_tables.py): each table
has found every key of the batch (its slots); the features it serves are cut out by
position, so the lookup has no data-dependent shapes and exports."""

import dataclasses

import fbgemm_gpu  # noqa: F401 - registers torch.ops.fbgemm (TorchRec's mean divisor)
import torch

from dynemb import _ops
from dynemb.config.table_options import DynamicEmbTableOptions
from dynemb.config.types import DynamicEmbPoolingMode


@dataclasses.dataclass(frozen=True)
class TableLookups:
    """One batch's found keys: ``tables[t]`` (the op tensors of table t) and
    ``slots[t]`` (every key's slot in it, -1 if absent) for the tables the features of
    ``feature_table_map`` use; ``missing[t]`` the eval initializer of absent keys;
    ``batch`` samples (bags per feature)."""

    tables: dict[int, list[torch.Tensor]]
    slots: dict[int, torch.Tensor]
    feature_table_map: list[int]
    missing: list[list[float]]
    table_options: list[DynamicEmbTableOptions]
    batch: int
    # 8-bit tables: rows[t] the 8-bit row of each slot of table t, row_format its code
    # (dynemb.inference.quantize); None: float rows (the tables' values).
    rows: dict[int, torch.Tensor] | None = None
    row_format: int | None = None

    def _pool(self, t: int, keys, offsets, weights, code: int) -> torch.Tensor:
        o = self.table_options[t]
        if self.row_format is None:
            return _ops.embedding_pool(
                self.tables[t], self.slots[t], keys, offsets, weights, code, self.missing[t],
                o.seed, o.dim,
            )  # fmt: skip
        return _ops.embedding_pool_quantized(
            self.tables[t], self.rows[t], self.row_format, self.slots[t], keys, offsets,
            weights, code, self.missing[t], o.seed, o.dim,
        )  # fmt: skip

    def _gather(self, t: int, keys) -> torch.Tensor:
        o = self.table_options[t]
        if self.row_format is None:
            return _ops.embedding_gather(
                self.tables[t], self.slots[t], keys, self.missing[t], o.seed, o.dim
            )
        return _ops.embedding_gather_quantized(
            self.tables[t], self.rows[t], self.row_format, self.slots[t], keys,
            self.missing[t], o.seed, o.dim,
        )  # fmt: skip

    def pooled(self, keys, offsets, weights, mean: bool) -> torch.Tensor:
        """(B, sum of feature dims): bags summed by the op, divided by the bags' sizes
        for mean pooling as a row-wise sharded TorchRec EBC does (its kernels sum)."""
        weights = weights.to(torch.float32) if weights is not None else None
        batch = self.batch
        code = _ops.POOLING_CODES[DynamicEmbPoolingMode.SUM.name]
        pooled = {t: self._pool(t, keys, offsets, weights, code) for t in self.tables}
        # Every table pooled every bag; feature f's are bags [f * B, (f + 1) * B).
        columns = [
            pooled[t][f * batch : (f + 1) * batch] for f, t in enumerate(self.feature_table_map)
        ]
        if mean:
            divisor = mean_divisor(offsets, weights).unsqueeze(1)
            columns = [c / divisor[f * batch : (f + 1) * batch] for f, c in enumerate(columns)]
        return torch.cat(columns, dim=1)

    def sequence(self, keys, offsets) -> torch.Tensor:
        """One row per key, each from the table of its feature."""
        out = None
        table_of_key = None
        if len(self.tables) > 1:
            positions = torch.arange(keys.shape[0], device=keys.device)
            bag = torch.searchsorted(offsets, positions, right=True) - 1
            feature = torch.div(bag, max(self.batch, 1), rounding_mode="floor")
            fmap = torch.tensor(self.feature_table_map, device=keys.device)
            table_of_key = fmap[feature].unsqueeze(1)
        for t in self.tables:
            rows = self._gather(t, keys)
            out = rows if out is None else torch.where(table_of_key == t, rows, out)
        return out


def mean_divisor(offsets: torch.Tensor, weights: torch.Tensor | None) -> torch.Tensor:
    """Each bag's mean divisor, TorchRec's (torchrec/distributed/embeddingbag.py
    ``_create_mean_pooling_divisor``): its length, or with weights the sum of its
    weights (fbgemm's segment_sum_csr, as TorchRec), plus 1e-6."""
    if weights is None:
        sizes = offsets[1:] - offsets[:-1]
    else:
        sizes = torch.ops.fbgemm.segment_sum_csr(1, offsets.int(), weights)
    return sizes + 1e-6
