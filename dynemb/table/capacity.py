"""Bucket counts of a growing table.

Growth doubles the bucket count, which the hash's range reduction turns into an
exact split (bucket b -> buckets 2b, 2b+1: see csrc/core/hash.h), so a rehash
never overflows a bucket of a table that evicts. To keep every step a doubling, the
maximum bucket count is rounded up to ``initial * 2**k``; the rounding adds fewer
than ``2**k`` buckets, i.e. less than one part in ``initial`` of the maximum.
"""


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
