"""``state_dict`` of an ordinary table held as a dynamic one: its rows, as TorchRec's.

TorchRec shows a row-wise sharded table in ``state_dict()`` as a ``ShardedTensor``
of shape ``(num_embeddings, embedding_dim)`` whose local shard is the rank's block of
rows. ``OrdinaryTableState`` (the module at ``<collection>.<table>``) does the same
for a table planned with ``ordinary_tables_as_dynamic``: saving reads the block's rows
from the hash table, loading writes them back. Loading takes TorchRec's
``ShardedTensor`` (any row-wise split covering the block) or a whole
``(num_embeddings, embedding_dim)`` tensor, e.g. an unsharded model's weight.
"""

import torch
from torch import nn
from torch.distributed._shard.metadata import ShardMetadata
from torch.distributed._shard.sharded_tensor import Shard, ShardedTensor, ShardedTensorMetadata
from torch.distributed._shard.sharded_tensor.metadata import TensorProperties

__all__ = ["OrdinaryTableState"]


class OrdinaryTableState(nn.Module):
    """``<collection>.<table>`` of an ordinary table held as a dynamic one.

    Args:
        kernel: the dynamic kernel holding the table (``read_ordinary_rows`` /
            ``write_ordinary_rows``).
        name: the table.
        shape: ``(num_embeddings, embedding_dim)``.
        shards: TorchRec's row-wise shards of the table (the plan's ``sharding_spec``),
            one per rank that holds rows.
        pg: the sharding's process group.
    """

    def __init__(self, kernel, name: str, shape, shards: list[ShardMetadata], pg) -> None:
        super().__init__()
        object.__setattr__(self, "_kernel", kernel)  # not a submodule: the lookup owns it
        self._name = name
        self._shape = torch.Size(shape)
        self._pg = pg
        self._rank = pg.rank() if pg is not None else 0
        self._shards = shards
        block = kernel.ordinary_block(name)
        mine = [s for s in shards if s.placement is not None and s.placement.rank() == self._rank]
        got = [(s.shard_offsets[0], s.shard_sizes[0]) for s in mine if s.shard_sizes[0]]
        want = [(block.start, len(block))] if len(block) else []
        if got != want:
            raise ValueError(
                f"table {name!r}: the plan's row-wise shard of rank {self._rank} (offset, "
                f"rows) {got} is not the block {want} its ids are routed to"
            )
        self._block = block
        self._metadata = mine[0] if mine else None

    def _save_to_state_dict(self, destination, prefix, keep_vars) -> None:
        rows = self._kernel.read_ordinary_rows(self._name)
        local = [Shard(rows, self._metadata)] if len(self._block) else []
        properties = TensorProperties(dtype=rows.dtype, layout=rows.layout)
        metadata = ShardedTensorMetadata(
            shards_metadata=self._shards, size=self._shape, tensor_properties=properties
        )
        destination[prefix + "weight"] = ShardedTensor._init_from_local_shards_and_global_metadata(  # noqa: SLF001 - TorchRec builds its tables' state so
            local, metadata, process_group=self._pg
        )

    def _load_from_state_dict(
        self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
    ) -> None:
        key = prefix + "weight"
        if key not in state_dict:
            if strict:
                missing_keys.append(key)
            return
        self._kernel.write_ordinary_rows(self._name, self._rows_of(key, state_dict[key]))

    def _rows_of(self, key: str, value) -> torch.Tensor:
        """This rank's block of rows in ``value``, checked before anything is written."""
        start, stop = self._block.start, self._block.stop
        if isinstance(value, ShardedTensor):
            for shard in value.local_shards():
                offset, rows = shard.metadata.shard_offsets[0], shard.metadata.shard_sizes[0]
                if offset <= start and stop <= offset + rows:
                    return self._checked(key, shard.tensor[start - offset : stop - offset])
            raise ValueError(
                f"{key}: the ShardedTensor's local shards do not hold rows [{start}, {stop}) "
                f"of table {self._name!r}, which this rank owns; load a state_dict saved with "
                "the same world size, or a whole (num_embeddings, embedding_dim) tensor"
            )
        if not isinstance(value, torch.Tensor) or value.shape != self._shape:
            shape = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
            raise ValueError(
                f"{key}: expected a ShardedTensor or a tensor of shape {tuple(self._shape)} "
                f"(num_embeddings, embedding_dim) for table {self._name!r}, got {shape}"
            )
        return self._checked(key, value[start:stop])

    def _checked(self, key: str, rows: torch.Tensor) -> torch.Tensor:
        if rows.shape != (len(self._block), self._shape[1]) or not rows.is_floating_point():
            raise ValueError(
                f"{key}: rows of table {self._name!r} must be floating point of shape "
                f"{(len(self._block), self._shape[1])}, got {rows.dtype} {tuple(rows.shape)}"
            )
        return rows

    def extra_repr(self) -> str:
        return (
            f"{self._name}: rows [{self._block.start}, {self._block.stop}) of {tuple(self._shape)}"
        )
