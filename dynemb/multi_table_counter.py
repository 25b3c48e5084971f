"""``MultiTableKVCounter``: DynamicEmb's counter over several tables, addressed by
``(key, table id)``, built from one ``KVCounter`` per table (``dynemb.embedding_admission``
re-exports it with dynemb.admission_strategies's ``KVCounter`` and ``FrequencyAdmissionStrategy``).
"""

from collections.abc import Sequence
from pathlib import Path

import torch

from dynemb.admission_strategies import KVCounter
from dynemb.config.types import MemoryType


class MultiTableKVCounter:
    """Counts of keys of several tables: table ``t`` counts in its own counter, built
    with ``kv_counters[t].create(device)`` (its capacity, bucket capacity, key type).

    Args:
        kv_counters: one KVCounter (a configuration) per table; at least one.
        device: where the counts live.

    Raises:
        ValueError: ``kv_counters`` empty; TypeError: an entry that is not a KVCounter.

    Example::

        counter = MultiTableKVCounter([KVCounter(1024), KVCounter(2048)], torch.device("cpu"))
        counter.add(torch.tensor([7, 7, 8]), torch.tensor([0, 1, 1]))  # tensor([1, 1, 1])
        counter.add(torch.tensor([7]), torch.tensor([1]))              # tensor([2])
    """

    def __init__(self, kv_counters: Sequence[KVCounter], device: str | torch.device) -> None:
        kv_counters = list(kv_counters)
        if not kv_counters:
            raise ValueError("MultiTableKVCounter: `kv_counters` must hold one KVCounter per table")
        for i, c in enumerate(kv_counters):
            if not isinstance(c, KVCounter):
                raise TypeError(
                    f"MultiTableKVCounter: kv_counters[{i}] must be a KVCounter, got {c!r}"
                )
        self.counters = [c.create(device) for c in kv_counters]
        self.device = self.counters[0].device

    def _table_ids(self, table_ids: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        if not isinstance(table_ids, torch.Tensor) or table_ids.shape != keys.shape:
            raise ValueError(
                f"MultiTableKVCounter: `table_ids` must be a tensor of shape {tuple(keys.shape)}, "
                f"got {table_ids!r}"
            )
        ids = table_ids.to(torch.int64)
        if ids.numel() and not (0 <= int(ids.min()) and int(ids.max()) < len(self.counters)):
            raise ValueError(
                f"MultiTableKVCounter: `table_ids` must be in [0, {len(self.counters)}), "
                f"got values in [{int(ids.min())}, {int(ids.max())}]"
            )
        return ids

    def add(
        self,
        keys: torch.Tensor,
        table_ids: torch.Tensor,
        frequencies: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Adds ``frequencies`` ((n,) int64; None: 1 each) to the count of each
        ``(key, table)``; returns the counts after adding ((n,) int64)."""
        ids = self._table_ids(table_ids, keys)
        counts = torch.zeros_like(keys, dtype=torch.int64)
        for t in torch.unique(ids).tolist():
            mask = ids == t
            freq = frequencies[mask] if frequencies is not None else None
            counts[mask] = self.counters[t].add(keys[mask], freq)
        return counts

    def erase(self, keys: torch.Tensor, table_ids: torch.Tensor) -> None:
        """Forgets each ``(key, table)``; absent ones are ignored."""
        ids = self._table_ids(table_ids, keys)
        for t in torch.unique(ids).tolist():
            self.counters[t].erase(keys[ids == t])

    def memory_usage(self, mem_type: MemoryType = MemoryType.DEVICE) -> int:
        """Bytes the counts take in ``mem_type``: DEVICE for counters on a GPU, HOST on CPU."""
        if not isinstance(mem_type, MemoryType):
            raise TypeError(
                f"MultiTableKVCounter.memory_usage: `mem_type` must be a MemoryType, got {mem_type!r}"
            )
        here = MemoryType.HOST if self.device.type == "cpu" else MemoryType.DEVICE
        return sum(c.memory_usage() for c in self.counters) if mem_type == here else 0

    def dump(self, key_file: str | Path, counter_file: str | Path, table_id: int) -> None:
        """Writes table ``table_id``'s keys and counts as headerless little-endian int64."""
        keys, counts = self._counter(table_id).dump()
        keys.cpu().numpy().tofile(str(key_file))
        counts.to(torch.int64).cpu().numpy().tofile(str(counter_file))

    def load(self, key_file: str | Path, counter_file: str | Path, table_id: int) -> None:
        """Reads the files ``dump`` wrote into table ``table_id``'s counter.

        Raises:
            ValueError: ``table_id`` out of range, or a file whose size is not what the
                layout implies (whole int64 keys, one int64 count per key), naming the
                file, its size and the size expected; the counter is unchanged.
        """
        counter = self._counter(table_id)
        key_bytes = Path(key_file).stat().st_size
        if key_bytes % 8:
            whole = key_bytes - key_bytes % 8
            raise ValueError(
                f"MultiTableKVCounter.load: `key_file` {key_file} holds {key_bytes} bytes, "
                f"expected a multiple of 8 (whole int64 keys, e.g. {whole} or {whole + 8}): "
                "truncated or extended"
            )
        rows = key_bytes // 8
        count_bytes = Path(counter_file).stat().st_size
        if count_bytes != key_bytes:
            raise ValueError(
                f"MultiTableKVCounter.load: `counter_file` {counter_file} holds {count_bytes} "
                f"bytes, expected {key_bytes} (one int64 count per key of {key_file}, which "
                f"holds {rows}): truncated, extended, or not this key file's counts"
            )
        keys = torch.from_file(str(key_file), dtype=torch.int64, size=rows)
        counts = torch.from_file(str(counter_file), dtype=torch.int64, size=rows)
        counter.load(keys.to(self.device), counts.to(self.device))

    def _counter(self, table_id: int) -> KVCounter:
        if not isinstance(table_id, int) or not 0 <= table_id < len(self.counters):
            raise ValueError(
                f"MultiTableKVCounter: `table_id` must be an int in [0, {len(self.counters)}), "
                f"got {table_id!r}"
            )
        return self.counters[table_id]


__all__ = ["MultiTableKVCounter"]
