"""Oracle of the DECAYED_LFU score (csrc/core/decay.h), kept apart on purpose.

``access_score`` and ``merge`` redo the core's fixed point from its definition: a score
L counts steps in units of 2**-16 and stands for the decayed count
``n(t) = 2 ** ((L / 2**16 - t) / half_life)``; one access of c occurrences at step s
scores ``s + H log2 c``; two scores merge to ``hi + H log2(1 + 2 ** -((hi - lo) / H))``.
Every product and quotient is floored in Q30, as the core does, so the oracle gives the
core's bits. ``exact_count`` is the same decayed count in floating point, from the
access history alone, to bound how far the fixed point drifts from it.
"""

FRACTION_BITS = 16
Q = 30
ONE = 1 << Q
MAX_SCORE = 2**63 - 1
# 2^-(2^-i) in Q30, rounded to nearest, i = 1..16 (a double holds them exactly enough).
ROOTS = [round(2.0 ** -(2.0**-i) * ONE) for i in range(1, 17)]


def _exp2_neg_fraction(f16: int) -> int:
    r = ONE
    for i in range(1, 17):
        if f16 >> (16 - i) & 1:
            r = r * ROOTS[i - 1] >> Q
    return r


def _log2_mantissa(z: int) -> int:
    out = 0
    for bit in range(Q - 1, -1, -1):
        z = z * z >> Q
        if z >= 2 * ONE:
            z >>= 1
            out |= 1 << bit
    return out


def access_score(step: int, count: int, half_life: int) -> int:
    """The score of ``count`` >= 1 accesses at ``step`` (a new key's score)."""
    n = count.bit_length() - 1
    mantissa = count << (Q - n) if n <= Q else count >> (n - Q)
    fraction = _log2_mantissa(mantissa)
    return (
        (step << FRACTION_BITS)
        + (half_life * n << FRACTION_BITS)
        + (half_life * fraction >> (Q - FRACTION_BITS))
    )


def merge(old: int, access: int, half_life: int) -> int:
    """A key scored ``old`` accessed again, the access scored ``access``."""
    hi, lo = max(old, access), min(old, access)
    x = (hi - lo) // half_life  # half-lives apart, Q16
    if x >> 16 >= Q:
        return hi
    y = _exp2_neg_fraction(x & 0xFFFF) >> (x >> 16)
    g = ONE if y == ONE else _log2_mantissa(ONE + y)
    return min(hi + (half_life * g >> (Q - FRACTION_BITS)), MAX_SCORE)


def touched(old: int | None, step: int, count: int, half_life: int) -> int:
    """The score after ``count`` accesses at ``step`` (``old`` None: a new key)."""
    if count == 0:
        return 0 if old is None else old
    access = access_score(step, count, half_life)
    return access if old is None else merge(old, access, half_life)


def exact_count(history, step: int, half_life: int) -> float:
    """sum of 2 ** -((step - s) / H) over the accesses ``history`` [(s, count), ...]."""
    return sum(c * 2.0 ** (-(step - s) / half_life) for s, c in history)


def count_of(score: int, step: int, half_life: int) -> float:
    """The decayed count a score stands for at ``step``."""
    return 2.0 ** ((score / 2**FRACTION_BITS - step) / half_life)
