"""How a serving table replays a delta: which of the delta's tables it serves, the
checks that refuse a delta out of order, and its rows after the delta.

A serving table (dynemb.inference.exportable_tables) holds only its op tensors; ``stored_rows``
reads ``(keys, embeddings)`` back from them, and ``replayed_rows`` gives the rows after
a delta: every stored key that the delta neither tombstones nor upserts, then the
delta's upserts. The serving module builds new tables from these and swaps them in.
"""

from collections.abc import Sequence

import torch

from dynemb.deltas.format import Delta, DeltaVersionError, TableDelta

Rows = tuple[torch.Tensor, torch.Tensor]  # keys (n,) int64, embeddings (n, dim)


def check_order(delta: Delta, version: int | None, base_dump_id: str | None) -> None:
    """Raises DeltaVersionError unless ``delta`` is the next one of the chain a module
    at ``version`` (None: not loaded from a base checkpoint) of base ``base_dump_id`` follows."""
    where = delta.path
    if version is None:
        raise DeltaVersionError(
            f"apply_delta({where}): this module was not loaded from a base checkpoint of "
            "dynemb's format (load_from_dynamicemb_file), so no delta chain starts here"
        )
    if delta.base_dump_id != base_dump_id:
        raise DeltaVersionError(
            f"apply_delta({where}): the delta follows base checkpoint {delta.base_dump_id!r}, "
            f"this module was loaded from {base_dump_id!r}"
        )
    if delta.version <= version:
        raise DeltaVersionError(
            f"apply_delta({where}): delta version {delta.version} is applied already "
            f"(this module is at version {version}; the next is {version + 1})"
        )
    if delta.version > version + 1:
        first, last = version + 1, delta.version - 1
        missing = f"version {first} is" if first == last else f"versions {first}..{last} are"
        raise DeltaVersionError(
            f"apply_delta({where}): delta version {delta.version} leaves a gap: this module is "
            f"at version {version}, {missing} missing"
        )


def served_tables(
    delta: Delta, names: Sequence[str], collection: str | None
) -> dict[str, TableDelta]:
    """``{module table name: TableDelta}``: the delta's tables of ``names`` in one
    collection (``collection``, e.g. ``"ebc"``; default: the only one holding them all).

    Raises:
        ValueError: no such collection, or several and none chosen.
    """
    saved = {name.rpartition(".")[::2]: name for name in delta.tables}  # (collection, table)
    holding = sorted({c for c, _ in saved if all((c, n) in saved for n in names)})
    if collection is not None:
        if collection not in holding:
            raise ValueError(
                f"collection={collection!r}: the delta {delta.path} has no collection holding "
                f"tables {list(names)} (collections holding them: {holding})"
            )
        holding = [collection]
    if len(holding) != 1:
        raise ValueError(
            f"{delta.path}: {len(holding)} collections hold tables {list(names)} ({holding}); "
            "pass collection= to choose one"
        )
    return {n: delta.tables[saved[(holding[0], n)]] for n in names}


def stored_rows(tensors: Sequence[torch.Tensor], dim: int) -> Rows:
    """Every stored ``(keys, embeddings)`` of a table's op tensors (BUFFERS order:
    digests, keys, scores, timestamps, values, locks, overflow, slow_values, pins); a slot
    past the fast tier's rows (``values``) has its row in ``slow_values``."""
    digests, keys, values, slow = tensors[0], tensors[1], tensors[4], tensors[7]
    slots = torch.nonzero(digests.reshape(-1), as_tuple=True)[0]
    stored = keys.reshape(-1)[slots]
    if slow.numel() == 0:
        return stored, values[slots, :dim]
    fast = values.shape[0]
    rows = torch.empty((slots.numel(), dim), dtype=values.dtype, device=values.device)
    low = slots < fast
    rows[low] = values[slots[low], :dim]
    rows[~low] = slow[(slots[~low] - fast).to(slow.device), :dim].to(rows.device)
    return stored, rows


def replayed_rows(rows: Rows, delta: TableDelta) -> Rows:
    """The rows after ``delta``: stored keys it neither tombstones nor upserts, then its upserts."""
    keys, values = rows
    device = keys.device
    gone = torch.cat([delta.tombstones, delta.keys]).to(device)
    keep = ~torch.isin(keys, gone)
    return (
        torch.cat([keys[keep], delta.keys.to(device)]),
        torch.cat([values[keep], delta.values.to(device, values.dtype)]),
    )


__all__ = ["check_order", "replayed_rows", "served_tables", "stored_rows"]
