"""How the kernel gets the slots of a batch's distinct keys: a find in eval, a
training lookup (inserting new keys), or, under admission, a lookup of the keys
admitted; keys that could not be stored are reported by the table's safe-check mode.

``TableSlots`` is a part of BatchedDynamicEmbeddingTables (it uses its ``tables``,
``table_options``, ``table_names``, ``admission_counters``, ``safe_check_failures``
and ``_inserts``).
"""

import warnings

import torch

from dynemb.types import DynamicEmbCheckMode


class TableSlots:
    """Slots of distinct keys per table (a mixin of BatchedDynamicEmbeddingTables)."""

    def _table_slots(self, t: int, keys: torch.Tensor, accesses: torch.Tensor):
        """Slots of the distinct keys of table t (inserting them in training), and the
        table's mutation count (backward finds the keys again if it changed)."""
        table = self.tables[t]
        if not self._inserts(t):
            return table.find_slots(keys), table.mutations
        if self.admission_counters[t] is not None:
            return self._admitted_slots(t, keys, accesses), table.mutations
        slots, stats = table.find_or_insert_slots(keys, accesses)
        if stats.failed:
            self._safe_check(t, stats.failed)
        return slots, table.mutations

    def _admitted_slots(self, t: int, keys: torch.Tensor, accesses: torch.Tensor):
        """Training slots of table t under admission (-1 for keys not admitted).

        Only keys not stored yet are counted (each distinct key once, with its
        occurrences in the batch); admitted keys are inserted together with the stored
        ones (whose scores the upsert updates) and leave the counter.
        """
        table, counter = self.tables[t], self.admission_counters[t]
        upsert = table.find_slots(keys) >= 0
        new = torch.nonzero(~upsert, as_tuple=True)[0]
        if new.numel():
            new_keys = keys[new]
            counts = counter.add(new_keys, accesses[new])
            admit = self.table_options[t].admit_strategy.admit(new_keys, counts)
            if not isinstance(admit, torch.Tensor) or admit.shape != new_keys.shape:
                raise TypeError(
                    f"table {self.table_names[t]!r}: admit_strategy.admit must return a "
                    f"({new_keys.numel()},) bool tensor, got {admit!r}"
                )
            upsert[new[admit.to(device=keys.device, dtype=torch.bool)]] = True
        slots = torch.full_like(keys, -1)
        pos = torch.nonzero(upsert, as_tuple=True)[0]
        if pos.numel():
            slots[pos], stats = table.find_or_insert_slots(keys[pos], accesses[pos])
            if stats.failed:
                self._safe_check(t, stats.failed)
        if new.numel():
            stored = new[slots[new] >= 0]  # admitted and stored: no longer counted
            if stored.numel():
                counter.erase(keys[stored])
        return slots

    def _safe_check(self, t: int, failed: int) -> None:
        self.safe_check_failures[t] += failed
        mode = self.table_options[t].safe_check_mode
        rows = "zero rows" if self.admission_counters[t] is None else "non-admitted rows"
        message = (
            f"dynamic table {self.table_names[t]!r}: {failed} keys could not be stored "
            f"(table full at capacity {self.tables[t].capacity()}); they got {rows}"
        )
        if mode == DynamicEmbCheckMode.ERROR:
            raise RuntimeError(message)
        if mode == DynamicEmbCheckMode.WARNING:
            warnings.warn(message, stacklevel=4)
