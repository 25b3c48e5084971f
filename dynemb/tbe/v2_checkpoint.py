"""DynamicEmb's per-module checkpoint and score members of ``BatchedDynamicEmbeddingTablesV2``.

Each is the model-level function of dynemb applied to this module alone (its tables
form the collection ``"model"``): ``dump`` / ``load`` are DynamicEmbDump /
DynamicEmbLoad, ``get_score`` / ``set_score`` / ``incremental_dump`` those of
dynemb.checkpoint.incremental, so they write, read and return the same things.
"""

import torch
import torch.distributed as dist

from dynemb.checkpoint import incremental
from dynemb.checkpoint.load import DynamicEmbLoad
from dynemb.checkpoint.writer import DynamicEmbDump
from dynemb.config.table_options import BATCH_SIZE_PER_DUMP

# The collection name of a module dumped or scored by itself.
_SELF = "model"


class CheckpointMembers:
    """Mixin of BatchedDynamicEmbeddingTablesV2 (uses ``tables``, ``table_names``)."""

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


__all__ = ["CheckpointMembers"]
