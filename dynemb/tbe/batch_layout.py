"""fbgemm TBE input conventions: checks, and the split of one batch per table.

A batch is feature-major: with T features and B samples, bag ``f * B + b`` is
``indices[offsets[f * B + b] : offsets[f * B + b + 1]]`` (``offsets`` has B * T + 1
entries). A table serves the features that ``feature_table_map`` maps to it; its
share of the batch is the concatenation of those features' indices, with their
offsets rebased, so one table op handles every feature of that table.

Optional per-index access counts say how many accesses an index stands for (a
de-duplicated batch, e.g. ``use_index_dedup``, sends each distinct key once with its
count); a table's distinct keys are then counted by the sum of their indices' counts
instead of their occurrences (``count_accesses``).
"""

import dataclasses

import torch

from dynemb import _ops
from dynemb._host_reads import read_to_host
from dynemb.table.padded_keys import padded_distinct_keys


@dataclasses.dataclass
class TableBatch:
    """One table's share of a batch.

    Attributes:
        features: the features (in feature order) served by the table.
        keys: (n_t,) int64, their indices concatenated.
        offsets: (len(features) * B + 1,) int64, rebased bag boundaries into ``keys``.
        weights: (n_t,) float32 per-sample weights, or None.
        index_ranges: per feature, its [begin, end) in the batch's ``indices``.
    """

    features: list[int]
    keys: torch.Tensor
    offsets: torch.Tensor
    weights: torch.Tensor | None
    index_ranges: list[tuple]


def check_batch(indices, offsets, per_sample_weights, num_features: int) -> int:
    """Validates a TBE batch; returns B. Raises TypeError / ValueError naming the argument."""
    return check_batch_layout(indices, offsets, per_sample_weights, num_features)[0]


def check_batch_layout(
    indices, offsets, per_sample_weights, num_features: int, access_counts=None
) -> tuple[int, list[int]]:
    """Validates a TBE batch and its optional per-index access counts with one read of
    device values (the feature boundaries, the bag-length check and the counts' checks
    packed in one tensor); returns ``(B, bounds)``, ``bounds[f]`` the first index of
    feature f (``num_features + 1`` entries), as ``split_by_table`` takes them.
    Raises TypeError / ValueError naming the argument, before anything reads the batch."""
    _check_batch_meta(indices, offsets, per_sample_weights, num_features)
    _check_access_counts_meta(access_counts, indices)
    B = (offsets.numel() - 1) // num_features
    # offsets[::B] is offsets[f * B] for f = 0 ... T: offsets[0] and offsets[-1] among them.
    parts = [offsets[::B] if B else offsets[:1]]
    if offsets.numel() > 1:
        parts.append((offsets[1:] < offsets[:-1]).any().view(1))
    counted = access_counts is not None and access_counts.numel() > 0
    if counted:
        total = access_counts.sum(dtype=torch.float64)
        parts += [access_counts.min().view(1), (total >= 2.0**63).view(1)]
    packed = torch.cat([p.to(device=offsets.device, dtype=torch.int64) for p in parts])
    host = read_to_host(packed, "batch layout").tolist()
    # Also for a single entry (no bag): offsets=[5] describes 5 indices that are absent.
    first, last = host[0], host[num_features if B else 0]
    if first != 0:
        raise ValueError(f"offsets must start at 0, got offsets[0]={first}")
    if last != indices.numel():
        raise ValueError(f"offsets must end at len(indices)={indices.numel()}, got {last}")
    if offsets.numel() > 1 and host[num_features + 1 if B else 1]:
        lengths = offsets[1:] - offsets[:-1]
        bag, length = read_to_host(_first_below(lengths, 0), "error message").tolist()
        raise ValueError(f"offsets must not decrease: bag {bag} has length {length}")
    if counted:
        low, overflow = host[-2:]
        if low < 1:
            at, _ = read_to_host(_first_below(access_counts, 1), "error message").tolist()
            raise ValueError(
                f"access_counts must be >= 1 (the accesses each index stands for), got "
                f"{low} at index {at}"
            )
        if overflow:
            raise ValueError(
                "access_counts must sum to at most 2**63 - 1 (a key's count is an int64), "
                f"got a sum of about {read_to_host(total, 'error message').item():.3e}"
            )
    bounds = host[: num_features + 1] if B else [0] * (num_features + 1)
    return B, bounds


def _first_below(values: torch.Tensor, floor: int) -> torch.Tensor:
    """(2,) int64: the position of the first of ``values`` below ``floor``, and its value."""
    at = torch.nonzero(values < floor)[0, 0]
    return torch.stack([at, values[at].to(torch.int64)])


def _check_batch_meta(indices, offsets, per_sample_weights, num_features: int) -> None:
    """check_batch's checks of types and shapes (they read no tensor values)."""
    if not isinstance(indices, torch.Tensor) or indices.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"indices must be an int64 (or int32) tensor, got {_describe(indices)}")
    if not isinstance(offsets, torch.Tensor) or offsets.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"offsets must be an int64 (or int32) tensor, got {_describe(offsets)}")
    if indices.dim() != 1 or offsets.dim() != 1:
        raise ValueError(
            f"indices and offsets must be 1-D, got shapes {tuple(indices.shape)} and {tuple(offsets.shape)}"
        )
    if offsets.numel() < 1 or (offsets.numel() - 1) % num_features:
        raise ValueError(
            f"offsets must have B * T + 1 entries with T={num_features} features, got {offsets.numel()}"
        )
    if per_sample_weights is not None:
        if (
            not isinstance(per_sample_weights, torch.Tensor)
            or not per_sample_weights.is_floating_point()
        ):
            raise TypeError(
                f"per_sample_weights must be a float tensor, got {_describe(per_sample_weights)}"
            )
        if per_sample_weights.shape != indices.shape:
            raise ValueError(
                f"per_sample_weights must have shape {tuple(indices.shape)}, got {tuple(per_sample_weights.shape)}"
            )


def contiguous_batch(*tensors) -> tuple:
    """The batch's tensors (indices, offsets, weights, access counts; ``None`` stays
    ``None``), each in contiguous memory: the ops read them as flat arrays, so a
    strided view (e.g. ``big[::2]``) is copied and a contiguous tensor is kept as is.
    Called where the module receives a batch, after its checks."""
    return tuple(None if t is None else t.contiguous() for t in tensors)


def split_by_table(
    indices, offsets, weights, feature_table_map, num_tables, batch_size, copy_keys=True,
    bounds=None,
):  # fmt: skip
    """Returns one TableBatch per table (None for a table no feature uses).

    The batch's keys and weights are copied once (a TableBatch outlives the call, up
    to backward, and must not see later in-place changes of the caller's tensors);
    a table with one feature gets views of the copies and a row of one rebasing of
    every feature's offsets, so the split costs a few ops whatever the number of tables.
    ``copy_keys=False``: int64 keys are not copied, for a caller that reads them only
    before it returns (a forward: its backward reads the offsets and weights, not them).
    ``bounds``: ``check_batch_layout``'s (None: read here from ``offsets``).
    """
    indices = indices.to(torch.int64, copy=copy_keys)
    offsets = offsets.to(torch.int64).contiguous()
    weights = None if weights is None else weights.to(torch.float32, copy=True)
    B, num_features = batch_size, len(feature_table_map)
    if bounds is None:
        bounds = (
            read_to_host(offsets[::B], "batch layout").tolist() if B else [0] * (num_features + 1)
        )
    # Row f: feature f's B + 1 bag boundaries, rebased to start at 0.
    rebased = offsets.new_zeros((num_features, B + 1))
    if B:
        rebased[:, :B] = offsets[:-1].view(num_features, B)
        rebased[:, B] = offsets[B::B]
        rebased -= offsets[:-1:B].unsqueeze(1)
    by_table = [[] for _ in range(num_tables)]
    for f, t in enumerate(feature_table_map):
        by_table[t].append(f)
    out = []
    for features in by_table:
        if not features:
            out.append(None)
            continue
        ranges = [(bounds[f], bounds[f + 1]) for f in features]
        if len(features) == 1:
            (a, b), f = ranges[0], features[0]
            w = weights[a:b] if weights is not None else None
            out.append(TableBatch(features, indices[a:b], rebased[f], w, ranges))
            continue
        keys = torch.cat([indices[a:b] for a, b in ranges])
        parts, base = [offsets[:1] * 0], 0
        for f, (a, b) in zip(features, ranges):
            parts.append(rebased[f, 1:] + base)
            base += b - a
        w = torch.cat([weights[a:b] for a, b in ranges]) if weights is not None else None
        out.append(TableBatch(features, keys, torch.cat(parts), w, ranges))
    return out


def _check_access_counts_meta(access_counts, indices: torch.Tensor) -> None:
    """The checks of the optional per-index access counts that read no values (None
    passes): an int64 (or int32) tensor of ``indices``' shape, on its device
    (``check_batch_layout`` checks the values: each >= 1, their sum < 2**63)."""
    if access_counts is None:
        return
    if not isinstance(access_counts, torch.Tensor) or access_counts.dtype not in (
        torch.int64,
        torch.int32,
    ):
        raise TypeError(
            f"access_counts must be an int64 (or int32) tensor of per-index access counts, "
            f"got {_describe(access_counts)}"
        )
    if access_counts.shape != indices.shape:
        raise ValueError(
            f"access_counts must have the shape of indices {tuple(indices.shape)} (one count "
            f"per index), got {tuple(access_counts.shape)}"
        )
    if access_counts.device != indices.device:
        raise ValueError(
            f"access_counts are on {access_counts.device}, indices on {indices.device}"
        )


def count_accesses(distinct: tuple, tb: TableBatch, access_counts: torch.Tensor) -> tuple:
    """A table's ``(unique, inverse, counts)`` with ``counts`` the sum of the access
    counts of each unique key's indices (``access_counts``: (n,) int64 of the whole
    batch; ``tb.index_ranges`` picks the table's share, in ``tb.keys`` order)."""
    unique, inverse, counts = distinct
    ranges = tb.index_ranges
    if len(ranges) == 1:
        per_index = access_counts[ranges[0][0] : ranges[0][1]]
    else:
        per_index = torch.cat([access_counts[a:b] for a, b in ranges])
    summed = torch.zeros_like(counts).index_add_(0, inverse, per_index.to(counts.dtype))
    return unique, inverse, summed


def _describe(x) -> str:
    return f"dtype {x.dtype}" if isinstance(x, torch.Tensor) else type(x).__name__


def distinct_keys(batches: list, padded: bool = False) -> list:
    """``unique_keys`` of each table's keys (None for absent tables), all tables in one
    op call (the executor de-duplicates them at once; each result depends on its own
    keys only). ``padded``: as PaddedKeys (dynemb.table.padded_keys), without a read of
    the device; each table's count comes with the next read."""
    present = [tb.keys for tb in batches if tb is not None]
    if not present:
        return [None] * len(batches)
    if padded:
        results = iter(padded_distinct_keys(present))
    else:
        results = zip(*_ops.unique_keys_grouped(present), strict=True)
    return [None if tb is None else next(results) for tb in batches]
