"""Per-rank size of a row-wise sharded dynamic table: rows aligned to buckets, bytes.

A dynamic table has ``num_buckets x bucket_capacity`` slots. Sharded row-wise over
``world_size`` ranks, each rank owns about ``num_embeddings / world_size`` keys, so
its table is that many rows rounded up to whole buckets of ``bucket_capacity`` slots,
as in DynamicEmb: a 40-row table with 128-slot buckets gets one 128-slot bucket per
rank (MAX_BUCKET_CAPACITY: one bucket of the rows rounded up to 16, 48 slots).
"""

import torch
from torchrec.modules.embedding_configs import BaseEmbeddingConfig, data_type_to_dtype

from dynemb.config.optimizer import EmbOptimType, OptimizerConfig

__all__ = [
    "BUCKET_ALIGNMENT",
    "DEMB_TABLE_ALIGN_SIZE",
    "MAX_BUCKET_CAPACITY",
    "align_to_table_size",
    "check_bucket_capacity",
    "effective_bucket_capacity",
    "get_sharded_table_capacity",
    "get_table_value_bytes",
    "rank_value_bytes",
]

BUCKET_ALIGNMENT = 16
"""Slots per bucket are a multiple of this: a probe compares 16 one-byte digests at once."""

DEMB_TABLE_ALIGN_SIZE = 16
"""Table sizes are rounded to multiples of this (``align_to_table_size``'s default)."""

MAX_BUCKET_CAPACITY = 2**63 - 1
"""Not a limit: the ``bucket_capacity`` that asks for one bucket per rank (as wide as
the rank's rows, rounded up to 16), as in DynamicEmb."""


def align_to_table_size(size: int, alignment: int = DEMB_TABLE_ALIGN_SIZE) -> int:
    """``size`` rounded up to a multiple of ``alignment``; ``size <= 0`` gives ``alignment``.

    Example::

        align_to_table_size(100)  # 112
        align_to_table_size(0)  # 16
    """
    if size <= 0:
        return alignment
    return _round_up(size, alignment)


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def _check_positive_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")


def check_bucket_capacity(bucket_capacity: object) -> None:
    """Raises ValueError unless ``bucket_capacity`` is a positive multiple of 16 or
    MAX_BUCKET_CAPACITY (one bucket per rank)."""
    _check_positive_int("bucket_capacity", bucket_capacity)
    if bucket_capacity % BUCKET_ALIGNMENT and bucket_capacity != MAX_BUCKET_CAPACITY:
        raise ValueError(
            f"bucket_capacity must be a positive multiple of {BUCKET_ALIGNMENT} "
            f"(or MAX_BUCKET_CAPACITY: one bucket per rank), got {bucket_capacity}"
        )


def _rows_per_rank(num_embeddings: int, world_size: int) -> int:
    _check_positive_int("num_embeddings", num_embeddings)
    _check_positive_int("world_size", world_size)
    return -(-num_embeddings // world_size)


def effective_bucket_capacity(num_embeddings: int, world_size: int, bucket_capacity: int) -> int:
    """The bucket width a rank uses, as DynamicEmb: ``bucket_capacity``; for
    MAX_BUCKET_CAPACITY the rows per rank rounded up to 16 (one bucket).

    Args:
        num_embeddings: rows of the whole table (the TorchRec config's ``num_embeddings``).
        world_size: ranks the table is sharded over.
        bucket_capacity: the requested width, a positive multiple of 16 (or
            MAX_BUCKET_CAPACITY: the rows per rank rounded up to 16, one bucket).

    Raises:
        ValueError: a non-positive size, or a bucket_capacity that is not a positive
            multiple of 16 (nor MAX_BUCKET_CAPACITY).

    Example::

        effective_bucket_capacity(100, 2, 128)  # 128: one 128-slot bucket for 50 rows
        effective_bucket_capacity(100, 2, MAX_BUCKET_CAPACITY)  # 64
    """
    check_bucket_capacity(bucket_capacity)
    rows = _rows_per_rank(num_embeddings, world_size)
    if bucket_capacity == MAX_BUCKET_CAPACITY:
        return _round_up(rows, BUCKET_ALIGNMENT)
    return bucket_capacity


def get_sharded_table_capacity(
    embedding_config: BaseEmbeddingConfig, world_size: int, bucket_capacity: int
) -> int:
    """Rows of one rank's table: ``ceil(num_embeddings / world_size)`` rounded up to a
    multiple of ``bucket_capacity`` (of 16 for MAX_BUCKET_CAPACITY: one bucket).

    Args:
        embedding_config: the table's ``EmbeddingBagConfig`` / ``EmbeddingConfig``.
        world_size: ranks the table is sharded over (row-wise).
        bucket_capacity: slots per bucket (the planner passes the effective width, see
            ``effective_bucket_capacity``).

    Raises:
        ValueError: a non-positive size, or a bucket_capacity that is not a positive
            multiple of 16 (nor MAX_BUCKET_CAPACITY).

    Example::

        config = EmbeddingBagConfig(name="t", embedding_dim=8, num_embeddings=1000,
                                    feature_names=["f"])
        get_sharded_table_capacity(config, world_size=3, bucket_capacity=128)  # 384
    """
    check_bucket_capacity(bucket_capacity)
    rows = _rows_per_rank(embedding_config.num_embeddings, world_size)
    if bucket_capacity == MAX_BUCKET_CAPACITY:
        return align_to_table_size(rows, BUCKET_ALIGNMENT)
    return _round_up(rows, bucket_capacity)


def get_table_value_bytes(
    embedding_config: BaseEmbeddingConfig,
    optimizer_type: EmbOptimType,
    world_size: int,
    bucket_capacity: int = 128,
    embedding_dtype: torch.dtype | None = None,
) -> int:
    """Bytes of the value rows of the whole table, **all ranks**: embedding plus
    optimizer state columns, ``world_size * rank_value_bytes(...)``.

    Pass it as ``global_hbm_for_values`` to keep every row in the fast tier. State
    columns per row: 0 (SGD / EXACT_SGD), 1 (EXACT_ROWWISE_ADAGRAD: dynemb keeps one
    4-byte column where DynamicEmb reserves 16 bytes), ``dim`` (EXACT_ADAGRAD) or
    ``2 * dim`` (ADAM). Keys, scores and digests are not counted.

    Args:
        embedding_config: the table's ``EmbeddingBagConfig`` / ``EmbeddingConfig``.
        optimizer_type: the fused optimizer (``dynemb.optimizer.EmbOptimType``).
        world_size: ranks the table is sharded over (row-wise).
        bucket_capacity: slots per bucket (as in ``get_sharded_table_capacity``).
        embedding_dtype: (dynemb) row storage type; ``None``: the config's ``data_type``.

    Raises:
        ValueError: an optimizer dynemb does not run, or a size as in
            ``get_sharded_table_capacity``.

    Example::

        config = EmbeddingBagConfig(name="t", embedding_dim=8, num_embeddings=1000,
                                    feature_names=["f"])
        get_table_value_bytes(config, EmbOptimType.ADAM, 2, 128)  # 2 * 512 rows * 24 cols * 4 B
    """
    rank_bytes = rank_value_bytes(
        embedding_config, optimizer_type, world_size, bucket_capacity, embedding_dtype
    )
    return rank_bytes * world_size


def rank_value_bytes(
    embedding_config: BaseEmbeddingConfig,
    optimizer_type: EmbOptimType,
    world_size: int,
    bucket_capacity: int,
    embedding_dtype: torch.dtype | None = None,
) -> int:
    """Bytes of one rank's value rows:
    ``get_sharded_table_capacity(...) * (dim + state_columns) * element_size``.

    Same arguments and errors as ``get_table_value_bytes`` (which is this times
    ``world_size``).
    """
    optimizer = OptimizerConfig(optimizer=optimizer_type)
    optimizer.validate()
    rows = get_sharded_table_capacity(embedding_config, world_size, bucket_capacity)
    dim = embedding_config.embedding_dim
    dtype = embedding_dtype or data_type_to_dtype(embedding_config.data_type)
    return rows * (dim + optimizer.state_columns(dim)) * dtype.itemsize
