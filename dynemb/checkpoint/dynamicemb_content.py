"""What can be verified of a checkpoint in NVIDIA DynamicEmb's layout, which carries no
checksum: beyond the file sizes (dynamicemb_layout.validate_table), its keys are
distinct over all the table's files (after the ``continuous`` conversion), its scores
(counts, steps, ages) are >= 0, and so are the admission counts, whose keys are
distinct too. A flipped bit in an embedding, an optimizer state, a score that stays
>= 0 or a key that stays distinct cannot be told from a trained value: only dynemb's
own format (CRC-32 per file) detects those."""

from collections.abc import Callable

import torch

from dynemb.dump_files.dynamicemb_layout import SavedShard, SavedTable, read_field

KeysOf = Callable[[SavedShard, torch.Tensor], torch.Tensor]  # saved ids -> raw keys


def content_errors(
    saved: SavedTable, keys_of: KeysOf, score_width: int, counter: bool
) -> list[str]:
    """The errors of a table's validated files: repeated keys, negative scores or counts.

    Args:
        saved: the table's files (sizes already checked).
        keys_of: the raw keys of a shard's saved ids.
        score_width: columns of the scores file.
        counter: also check the admission counter files.

    Returns:
        One message per problem, naming the file (or the files) and the value.
    """
    errors = _distinct(saved, keys_of, "keys", lambda s: s.rows)
    for shard in saved.shards:
        errors += _not_negative(shard, "scores", shard.rows, score_width)
    if counter:
        errors += _distinct(saved, keys_of, "counter_keys", lambda s: s.counter_rows)
        for shard in saved.shards:
            errors += _not_negative(shard, "counter_counts", shard.counter_rows, 0)
    return errors


def _distinct(saved: SavedTable, keys_of: KeysOf, field: str, rows_of) -> list[str]:
    parts, owners = [], []
    for shard in saved.shards:
        n = rows_of(shard)
        if n:
            parts.append(keys_of(shard, read_field(shard, field, 0, n, 0)))
            owners.append(torch.full((n,), len(owners), dtype=torch.int64))
    if not parts:
        return []
    keys, owner = torch.cat(parts), torch.cat(owners)
    ordered, order = torch.sort(keys, stable=True)
    same = torch.nonzero(ordered[1:] == ordered[:-1], as_tuple=True)[0]
    if not same.numel():
        return []
    key = int(ordered[same[0]])
    shards = [saved.shards[i] for i in sorted(set(owner[keys == key].tolist()))]
    files = ", ".join(str(s.files[field]) for s in shards)
    return [
        f"table {saved.table!r}: key {key} is saved more than once ({same.numel()} repeats "
        f"in all), in {files}: the checkpoint is damaged"
    ]


def _not_negative(shard: SavedShard, field: str, rows: int, width: int) -> list[str]:
    if not rows:
        return []
    values = read_field(shard, field, 0, rows, width).reshape(-1)
    low = int(values.min())
    if low >= 0:
        return []
    row = int(torch.argmin(values)) // max(1, width)
    return [f"{shard.files[field]}: row {row} holds {low}, a count or score must be >= 0"]


__all__ = ["content_errors"]
