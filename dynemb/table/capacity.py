"""Bucket counts of a growing table.

A table that evicts doubles its bucket count, which the hash's range reduction turns
into an exact split (bucket b -> buckets 2b, 2b+1: see csrc/core/hash.h), so a rehash
never overflows a bucket: it keeps no spill window to take an excess. To keep every
step a doubling, the maximum bucket count is rounded up to ``initial * 2**k``; the
rounding adds fewer than ``2**k`` buckets, i.e. less than one part in ``initial`` of
the maximum.

A NO_EVICTION table grows by ``NO_EVICTION_GROWTH`` (3/10 more buckets, at least
one): the range reduction takes any bucket count, and a bucket that receives more
than it holds spills into its window as an insert would. Growing by less than
doubling keeps memory per key close to the payload right after a growth (the load
factor falls from ~0.9 to ~0.7, not to ~0.45) and the rehash's old + new storage
to 2.3x the old table instead of 3x.
"""

NO_EVICTION_GROWTH = (13, 10)  # the bucket count's factor: 13/10


def bucket_counts(init_capacity: int, max_capacity: int, bucket_capacity: int) -> tuple[int, int]:
    """Returns ``(initial_buckets, max_buckets)`` with ``max_buckets = initial_buckets * 2**k``.

    ``initial_buckets * bucket_capacity >= init_capacity`` and
    ``max_buckets * bucket_capacity >= max_capacity``.
    """
    want_max = -(-max_capacity // bucket_capacity)
    want_init = min(want_max, -(-init_capacity // bucket_capacity))
    doublings = 0
    while 2 ** (doublings + 1) <= want_max and -(-want_max // 2 ** (doublings + 1)) >= want_init:
        doublings += 1
    initial = -(-want_max // (2**doublings))
    return initial, initial * 2**doublings


def next_bucket_count(num_buckets: int, max_buckets: int, evicts: bool) -> int:
    """The bucket count a growth of a table with ``num_buckets`` (< ``max_buckets``)
    goes to: twice as many for a table that ``evicts``, else ``NO_EVICTION_GROWTH``
    times as many (rounded up, at least one more); never above ``max_buckets``.

    Raises:
        ValueError: ``num_buckets`` not in ``[1, max_buckets)``.
    """
    if not 1 <= num_buckets < max_buckets:
        raise ValueError(
            f"num_buckets must be in [1, max_buckets={max_buckets}) to grow, got {num_buckets}"
        )
    if evicts:
        return min(2 * num_buckets, max_buckets)
    num, den = NO_EVICTION_GROWTH
    return min(max(-(-num_buckets * num // den), num_buckets + 1), max_buckets)
