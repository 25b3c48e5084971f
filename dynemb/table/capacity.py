"""Bucket counts of a growing table.

A table that evicts doubles its bucket count, which the hash's range reduction turns
into an exact split (bucket b -> buckets 2b, 2b+1: see csrc/core/hash.h), so a rehash
never overflows a bucket: it keeps no spill window to take an excess. To keep every
step a doubling, the maximum bucket count is rounded up to ``initial * 2**k``; the
rounding adds fewer than ``2**k`` buckets, i.e. less than one part in ``initial`` of
the maximum.

A NO_EVICTION table grows to the bucket count that its entries fill to
``LOAD_AFTER_GROWTH``, by a factor between ``NO_EVICTION_LEAST_GROWTH`` and
``NO_EVICTION_GROWTH`` (1.25 and 1.3): the range reduction takes any bucket count, and
a bucket that receives more than it holds spills into its other bucket as an insert
would. A table grows when an insert finds both its buckets full, at a load that varies
(0.91 to 0.95 for random keys); a fixed factor would carry that spread into the load
after the growth, hence into memory per key. Aiming at one load makes memory right
after every growth one figure a user can plan on (~1.37x the payload of dim-16 rows),
while growing by less than doubling keeps the rehash's old + new storage at most 2.3x
the old table instead of 3x.
"""

NO_EVICTION_GROWTH = (13, 10)  # the most a growth multiplies the bucket count by
NO_EVICTION_LEAST_GROWTH = (5, 4)  # the least
LOAD_AFTER_GROWTH = (37, 50)  # 0.74: the load a NO_EVICTION growth aims at


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


def next_bucket_count(
    num_buckets: int, max_buckets: int, evicts: bool, entries: int, bucket_capacity: int
) -> int:
    """The bucket count a growth of a table with ``num_buckets`` (< ``max_buckets``)
    goes to: twice as many for a table that ``evicts``; else the fewest buckets of
    ``bucket_capacity`` slots that its ``entries`` fill to at most ``LOAD_AFTER_GROWTH``,
    at least ``NO_EVICTION_LEAST_GROWTH`` and at most ``NO_EVICTION_GROWTH`` times as
    many (rounded up, at least one more); never above ``max_buckets``.

    Raises:
        ValueError: ``num_buckets`` not in ``[1, max_buckets)``.
    """
    if not 1 <= num_buckets < max_buckets:
        raise ValueError(
            f"num_buckets must be in [1, max_buckets={max_buckets}) to grow, got {num_buckets}"
        )
    if evicts:
        return min(2 * num_buckets, max_buckets)
    (most_num, most_den), (least_num, least_den) = NO_EVICTION_GROWTH, NO_EVICTION_LEAST_GROWTH
    load_num, load_den = LOAD_AFTER_GROWTH
    most = -(-num_buckets * most_num // most_den)
    least = max(-(-num_buckets * least_num // least_den), num_buckets + 1)
    aim = -(-entries * load_den // (load_num * bucket_capacity))
    return min(max(least, min(aim, most)), max_buckets)
