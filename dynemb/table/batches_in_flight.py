"""Whole-table writes (a load, ``fill_tables``) refuse tables with batches in flight.

A training forward's backward applies gradients computed from the rows the forward
read, and a cached table writes the rows it staged for that forward back to its slow
tier when the backward ends. A load between the two would have those gradients
applied to the loaded rows, and the staged rows, older than the load, overwrite it.
So a load or a fill waits for no batch: it refuses, naming the tables and their
batches, before anything changes.
"""

import gc
from collections.abc import Sequence

from dynemb.table.protocol import Table


def refuse_batches_in_flight(tables: Sequence[tuple[str, Table]], what: str) -> None:
    """Raises unless no table of ``tables`` (``(name, table)`` pairs) has a batch in
    flight. Forwards whose graphs were dropped unused end first (a cyclic collection),
    so only batches someone still holds count.

    Raises:
        RuntimeError: naming ``what``, each busy table and its batches in flight.
    """
    busy = _busy(tables)
    if busy:
        gc.collect()  # holds of graphs dropped in reference cycles end here
        busy = _busy(tables)
    if busy:
        listed = ", ".join(f"{name!r} ({n})" for name, n in busy)
        raise RuntimeError(
            f"{what}: tables have batches in flight (a training forward awaiting its "
            f"backward, or a prefetch awaiting its forward): {listed}; run their "
            f"backward or drop their outputs first (nothing was changed)"
        )


def _busy(tables: Sequence[tuple[str, Table]]) -> list[tuple[str, int]]:
    counts = [(name, table.batches_in_flight()) for name, table in tables]
    return [(name, n) for name, n in counts if n]


__all__ = ["refuse_batches_in_flight"]
