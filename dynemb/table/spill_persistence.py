"""How a spilled ScoredHashTable commits and reopens its spill directory (see
spill_files.py for the files).

``SpillPersistence`` is a part of ScoredHashTable (it uses the table's ``_storage``,
``_layout``, ``_spill``, ``_step``, ``_size``, ``_strategy``, ``_max_buckets``).
"""

import torch

from dynemb.table.table_storage import TableStorage


class SpillPersistence:
    """Spill-directory commits and reopening (a mixin of ScoredHashTable)."""

    def _spill_meta(self) -> dict:
        layout = self._layout
        return {
            "dim": self.dim,
            "row_width": layout.row_width,
            "bucket_capacity": layout.bucket_capacity,
            "value_dtype": str(layout.value_dtype),
            "strategy": self._strategy,
            "max_buckets": self._max_buckets,
            "fast_rows": layout.fast_rows,
        }

    def _commit_spill(self) -> None:
        storage = self._storage
        storage.sync()
        state = {"num_buckets": storage.num_buckets, "generation": storage.generation}
        state["step"] = self._step
        self._spill.write_meta({"layout": self._spill_meta(), "state": state})
        self._spill.remove_generations_except(storage.generation)

    def _reopen(self, meta: dict) -> None:
        want = self._spill_meta()
        for name, value in want.items():
            if meta["layout"].get(name) != value:
                raise ValueError(
                    f"spill directory {self._spill.path!r} holds a table with {name}="
                    f"{meta['layout'].get(name)!r}, these arguments give {name}={value!r}"
                )
        state = meta["state"]
        self._storage = TableStorage(
            self._layout, state["num_buckets"], self._spill, state["generation"], reopen=True
        )
        self._size = int(torch.count_nonzero(self._storage.digests))
        self._step = state["step"]
