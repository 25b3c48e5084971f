"""Embedding admission: a new key is stored only once it has been seen often enough.

Two small interfaces (names mirror NVIDIA DynamicEmb):

- a ``Counter`` remembers how often each not-yet-stored key was seen
  (``KVCounter``: a bounded hash table that forgets the least counted keys);
- an ``AdmissionStrategy`` decides from those counts which keys a table stores
  (``FrequencyAdmissionStrategy``: count >= threshold).

A table opts in with ``DynamicEmbTableOptions(admit_strategy=FrequencyAdmissionStrategy(
threshold, counter=KVCounter(capacity)))``, the strategy carrying the counter it counts
with, as in DynamicEmb; the table option ``admission_counter`` is DynamicEmb's older,
deprecated place for it. BatchedDynamicEmbeddingTables does the counting (see
DynamicEmb_APIs.md, "Admission").
"""

import abc
import threading
from collections.abc import Sequence

import torch

from dynemb import _ops
from dynemb._host_reads import read_to_host
from dynemb.config.table_options import DynamicEmbInitializerArgs
from dynemb.config.types import DynamicEmbScoreStrategy
from dynemb.table.placement import canonical_device
from dynemb.table.scored_hash_table import ScoredHashTable

__all__: Sequence[str] = [
    "AdmissionStrategy",
    "Counter",
    "FrequencyAdmissionStrategy",
    "KVCounter",
    "ProbabilisticAdmissionStrategy",
]


class Counter(abc.ABC):
    """Interface of a key -> count table used for admission.

    A counter given in ``DynamicEmbTableOptions.admission_counter`` is a template:
    each table builds its own empty counter with ``create(device)``, so tables (and
    the shards of one table) never mix their counts.
    """

    @abc.abstractmethod
    def add(self, keys: torch.Tensor, frequency: torch.Tensor | None = None) -> torch.Tensor:
        """Adds ``frequency`` to the count of each key.

        Args:
            keys: (n,) int64; a key may repeat (its frequencies are summed).
            frequency: (n,) int64 >= 0, or ``None`` for one occurrence per key.

        Returns:
            (n,) int64: each key's count after adding.
        """

    def add_distinct(self, keys: torch.Tensor, frequency: torch.Tensor) -> torch.Tensor:
        """``add`` for a training batch: ``keys`` distinct and ``frequency`` (n,) int64
        >= 0 on the counter's device, as the caller built them, so a counter may skip
        the checks (and their reads of the device) that ``add`` makes. Returns the
        same counts as ``add``; by default it is ``add``."""
        return self.add(keys, frequency)

    @abc.abstractmethod
    def erase(self, keys: torch.Tensor) -> None:
        """Forgets keys ((n,) int64); absent keys are ignored."""

    @abc.abstractmethod
    def memory_usage(self) -> int:
        """Bytes held by the counter."""

    @abc.abstractmethod
    def dump(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns ``(keys, counts)``: (m,) int64 each, every remembered key once (any order)."""

    @abc.abstractmethod
    def load(self, keys: torch.Tensor, counts: torch.Tensor) -> None:
        """Sets the count of each key (others are kept): the inverse of ``dump``.

        Args:
            keys: (m,) int64, distinct.
            counts: (m,) int64 >= 0.
        """

    @abc.abstractmethod
    def create(self, device: str | torch.device | None = None) -> "Counter":
        """Returns a new, empty counter with this one's configuration on ``device``."""


class KVCounter(Counter):
    """A bounded counter: a ScoredHashTable whose score is the key's count.

    Counts are exact for the keys it keeps. When a bucket is full, the key with the
    smallest (count, key) is forgotten; a new key counted below every key of its
    full bucket is not remembered (its count is still returned, for this call).

    As in DynamicEmb, the constructor only records the configuration, so a counter
    in ``DynamicEmbTableOptions`` pickles with the plan: the table is built on first
    use, and ``create`` builds each sharded table's own counter. Pickling keeps the
    counts.

    Thread-safe, like the tables: every op that reads or changes the counts (``add``,
    ``erase``, ``dump``, ``load``, ``size``, ``memory_usage``, pickling) holds the
    counter's lock, so an ``add`` is one read-add-store that no other op interleaves
    with. A copy (``copy.deepcopy``, pickle) gets a lock of its own.

    Args:
        capacity: keys it can hold per rank (rounded up to whole buckets; a capacity
            below ``bucket_capacity`` gives one bucket).
        bucket_capacity: slots per bucket, positive; rounded up to a multiple of 16
            (default 1024).
        key_type: key dtype; only ``torch.int64``.
        device: where the table lives (default CPU).

    Raises:
        TypeError / ValueError: on a bad argument, naming it and its value.

    Example::

        >>> c = KVCounter(capacity=1024, bucket_capacity=16)
        >>> c.add(torch.tensor([7, 8, 7]))
        tensor([2, 1, 2])
        >>> c.add(torch.tensor([7]), torch.tensor([5]))
        tensor([7])
        >>> keys, counts = c.dump()                # slot order
        >>> sorted(zip(keys.tolist(), counts.tolist()))
        [(7, 7), (8, 1)]
    """

    def __init__(
        self,
        capacity: int,
        bucket_capacity: int = 1024,
        key_type: torch.dtype = torch.int64,
        device: str | torch.device | None = None,
    ) -> None:
        if key_type != torch.int64:
            raise ValueError(f"KVCounter: key_type must be torch.int64, got {key_type}")
        for name, v in (("capacity", capacity), ("bucket_capacity", bucket_capacity)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"KVCounter: {name} must be a positive int, got {v!r}")
        self.bucket_capacity = -(-bucket_capacity // 16) * 16
        self.capacity = -(-capacity // self.bucket_capacity) * self.bucket_capacity
        self.key_type = key_type
        self._device = canonical_device(device if device is not None else "cpu")
        self._lock = threading.Lock()
        self._table_or_none: ScoredHashTable | None = None

    @property
    def _table(self) -> ScoredHashTable:
        """The table, built on first use (read under ``_lock``)."""
        if self._table_or_none is None:
            # CUSTOMIZED with the count as score (not LFU): the count is then exactly
            # the score we set, load() can restore any count, and a newcomer never
            # evicts a key counted more often. The value row is unused: 1 fp16 column.
            self._table_or_none = ScoredHashTable(
                dim=1,
                capacity=self.capacity,
                bucket_capacity=self.bucket_capacity,
                score_strategy=DynamicEmbScoreStrategy.CUSTOMIZED,
                value_dtype=torch.float16,
                device=self._device,
            )
        return self._table_or_none

    def __getstate__(self) -> dict:
        state = {k: v for k, v in self.__dict__.items() if k not in ("_lock", "_table_or_none")}
        with self._lock:
            state["counts"] = self._dump() if self._table_or_none is not None else None
        return state

    def __setstate__(self, state: dict) -> None:
        counts = state.pop("counts")
        self.__dict__.update(state)
        self._lock = threading.Lock()
        self._table_or_none = None
        if counts is not None and counts[0].numel():
            self.load(*counts)

    @property
    def device(self) -> torch.device:
        return self._device

    def size(self) -> int:
        """Number of remembered keys."""
        with self._lock:
            return self._table.size() if self._table_or_none is not None else 0

    def add(self, keys: torch.Tensor, frequency: torch.Tensor | None = None) -> torch.Tensor:
        keys = self._check_keys(keys)
        if frequency is None:
            frequency = torch.ones_like(keys)
        frequency = self._check_counts("frequency", frequency, keys)
        if keys.numel() == 0:
            return torch.zeros_like(keys)
        unique, inverse, _ = _ops.unique_keys(keys)
        added = _saturating_sum(frequency, inverse, unique.numel())
        return self._add_to_distinct(unique, added)[inverse]

    def add_distinct(self, keys: torch.Tensor, frequency: torch.Tensor) -> torch.Tensor:
        """``add`` without its checks: no read of the device (not even the distinct
        count), the stored counts' status read later (the counter cannot grow)."""
        if keys.numel() == 0:
            return torch.zeros_like(keys)
        return self._add_to_distinct(keys, frequency.clamp(max=_ops.MAX_SCORE))

    def _add_to_distinct(self, keys: torch.Tensor, added: torch.Tensor) -> torch.Tensor:
        with self._lock:  # the read-add-store is one step for other threads
            # Scores are 0 for absent keys, so old + added is the exact new count; like
            # the tables' LFU counts (core/score_policy.h) it saturates at MAX_SCORE.
            old = self._table.get_scores(keys)
            counts = old + torch.minimum(added, _ops.MAX_SCORE - old)
            self._store(keys, counts)
        return counts

    def erase(self, keys: torch.Tensor) -> None:
        keys = self._check_keys(keys)
        with self._lock:
            self._table.erase_keys(keys)  # not erase(): its count would be a read

    def memory_usage(self) -> int:
        with self._lock:
            return self._table.memory_usage() if self._table_or_none is not None else 0

    def dump(self) -> tuple[torch.Tensor, torch.Tensor]:
        with self._lock:
            return self._dump()

    def load(self, keys: torch.Tensor, counts: torch.Tensor) -> None:
        keys = self._check_keys(keys)
        counts = self._check_counts("counts", counts, keys)
        if keys.numel() and _ops.unique_keys(keys)[0].numel() != keys.numel():
            raise ValueError("KVCounter.load: keys must be distinct")
        if keys.numel():
            with self._lock:
                self._store(keys, counts)

    def create(self, device: str | torch.device | None = None) -> "KVCounter":
        return KVCounter(
            self.capacity,
            self.bucket_capacity,
            self.key_type,
            device=device if device is not None else self.device,
        )

    def _dump(self) -> tuple[torch.Tensor, torch.Tensor]:  # under _lock
        keys, _, counts, _ = self._table.export_batch(0, self._table.capacity())
        return keys, counts

    def _store(self, keys: torch.Tensor, counts: torch.Tensor) -> None:  # under _lock
        # keys distinct, counts >= 0 (checked or computed so): nothing to check or read
        values = torch.zeros((keys.numel(), 1), dtype=torch.float16, device=self.device)
        self._table.assign_scored(keys, values, counts.contiguous())

    def _check_keys(self, keys) -> torch.Tensor:
        if not isinstance(keys, torch.Tensor) or keys.dtype != torch.int64 or keys.dim() != 1:
            raise TypeError(f"KVCounter: keys must be a 1-D int64 tensor, got {_describe(keys)}")
        if keys.device != self.device:
            raise ValueError(f"KVCounter: keys are on {keys.device}, the counter on {self.device}")
        return keys.contiguous()

    def _check_counts(self, name: str, counts, keys: torch.Tensor) -> torch.Tensor:
        if not isinstance(counts, torch.Tensor) or counts.dtype != torch.int64:
            raise TypeError(f"KVCounter: {name} must be an int64 tensor, got {_describe(counts)}")
        if counts.shape != keys.shape:
            raise ValueError(
                f"KVCounter: {name} has shape {tuple(counts.shape)}, keys {tuple(keys.shape)}"
            )
        low = read_to_host(counts.min(), "count check").item() if counts.numel() else 0
        if low < 0:
            raise ValueError(f"KVCounter: {name} must be >= 0, got {low}")
        return counts.to(keys.device).contiguous()


def _saturating_sum(values: torch.Tensor, groups: torch.Tensor, n: int) -> torch.Tensor:
    """(n,) int64 sums of the non-negative int64 ``values`` by ``groups``, saturated at
    MAX_SCORE: each value is split in 2**31-sized halves so no partial sum can wrap."""
    high = torch.zeros(n, dtype=torch.int64, device=values.device)
    low = torch.zeros_like(high)
    high.index_add_(0, groups, values >> 31)
    low.index_add_(0, groups, values & (2**31 - 1))
    # With fewer than 2**31 values high < 2**63 and low < 2**62 (no wrap). The total
    # high * 2**31 + low is over MAX_SCORE if high > limit; else it is below 2**64 and
    # an overflow shows as a negative int64.
    limit = _ops.MAX_SCORE >> 31
    total = (high.clamp(max=limit) << 31) + low
    return torch.where((high > limit) | (total < 0), _ops.MAX_SCORE, total)


class AdmissionStrategy(abc.ABC):
    """Decides which new keys a table stores, from their counts.

    Attributes:
        counter: the Counter (a template: each table builds its own with ``create``)
            whose counts ``admit`` reads, or None: the table's ``admission_counter``.
    """

    counter: Counter | None = None
    #: Whether the table counts keys for this strategy (in ``counter``); a strategy
    #: that does not is given each key's occurrences in the batch as its frequency.
    counts_keys: bool = True

    @abc.abstractmethod
    def admit(self, keys: torch.Tensor, frequencies: torch.Tensor) -> torch.Tensor:
        """Returns (n,) bool: True for the keys to store.

        Args:
            keys: (n,) int64 keys not stored in the table.
            frequencies: (n,) int64, their counts (this batch included).
        """

    def admit_at(self, keys: torch.Tensor, frequencies: torch.Tensor, step: int) -> torch.Tensor:
        """The table's call: ``admit`` at the table's ``step`` (its ``score_step`` before
        the batch), for a strategy whose choice depends on it; by default ``admit``."""
        return self.admit(keys, frequencies)

    @abc.abstractmethod
    def get_initializer_args(self) -> DynamicEmbInitializerArgs | None:
        """Rows given to keys not admitted (``None``: the table's ``initializer_args``)."""


class FrequencyAdmissionStrategy(AdmissionStrategy):
    """Admits a key once it has been seen ``threshold`` times.

    Args:
        threshold: int >= 0; a key is stored when its count reaches it (0 and 1
            admit every key on first sight, still counting it).
        initializer_args: rows of keys not yet admitted, for the lookup that sees
            them (``None``: the table's own ``initializer_args``, so a key keeps the
            row it will start from once admitted).
        counter: the Counter that counts the keys not yet admitted (e.g.
            ``KVCounter(capacity)``), as in DynamicEmb; each table builds its own from
            it. ``None``: the table's (deprecated) ``admission_counter`` is used.

    Raises:
        TypeError / ValueError: on a bad threshold, initializer_args or counter.

    Two strategies are equal when their class, threshold, initializer mode and counter
    configuration (class, bucket capacity, key type; not its capacity) are, as
    DynamicEmb groups tables.

    Example::

        >>> s = FrequencyAdmissionStrategy(threshold=3, counter=KVCounter(1 << 20))
        >>> s.admit(torch.tensor([1, 2]), torch.tensor([3, 2]))
        tensor([ True, False])
    """

    def __init__(
        self,
        threshold: int,
        initializer_args: DynamicEmbInitializerArgs | None = None,
        counter: Counter | None = None,
    ) -> None:
        if not isinstance(threshold, int) or isinstance(threshold, bool):
            raise TypeError(
                f"FrequencyAdmissionStrategy: threshold must be an int, got {threshold!r}"
            )
        if threshold < 0:
            raise ValueError(f"FrequencyAdmissionStrategy: threshold must be >= 0, got {threshold}")
        if initializer_args is not None:
            if not isinstance(initializer_args, DynamicEmbInitializerArgs):
                raise TypeError(
                    "FrequencyAdmissionStrategy: initializer_args must be DynamicEmbInitializerArgs "
                    f"or None, got {initializer_args!r}"
                )
            initializer_args.validate()
        if counter is not None and not isinstance(counter, Counter):
            raise TypeError(
                f"FrequencyAdmissionStrategy: counter must be a Counter (e.g. KVCounter) or "
                f"None, got {counter!r}"
            )
        self.threshold = threshold
        self.initializer_args = initializer_args
        self.counter = counter

    def with_counter(self, counter: Counter) -> "FrequencyAdmissionStrategy":
        """A copy of this strategy counting with ``counter`` (this one is unchanged):
        how a table's deprecated ``admission_counter`` reaches the strategy, per table,
        when one strategy serves several tables of different counter capacities."""
        return FrequencyAdmissionStrategy(self.threshold, self.initializer_args, counter)

    def admit(self, keys: torch.Tensor, frequencies: torch.Tensor) -> torch.Tensor:
        return frequencies >= self.threshold

    def get_initializer_args(self) -> DynamicEmbInitializerArgs | None:
        return self.initializer_args

    def get_grouped_key(self) -> tuple:
        """What two tables must agree on to share a module (DynamicEmb's grouping key)."""
        c = self.counter
        counter = None if c is None else (type(c), getattr(c, "bucket_capacity", None),
                                          getattr(c, "key_type", None))  # fmt: skip
        mode = None if self.initializer_args is None else self.initializer_args.mode
        return (type(self), self.threshold, mode, counter)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, FrequencyAdmissionStrategy):
            return NotImplemented
        return self.get_grouped_key() == other.get_grouped_key()

    def __hash__(self) -> int:
        return hash(self.get_grouped_key())


class ProbabilisticAdmissionStrategy(AdmissionStrategy):
    """Admits a missing key with probability ``probability`` each time a batch holds it,
    with no counter: a key seen k times in one batch is admitted with probability
    ``1 - (1 - probability) ** k``, so on average it takes ``1 / probability``
    appearances. Nothing is counted, so nothing is stored or checkpointed besides the
    table.

    The draw is a pure function of (key, ``seed``, the table's step): a 64-bit mix of
    them in torch integer ops, its top 53 bits a uniform float64 ``u``; the key is
    admitted when ``u < 1 - (1 - probability) ** k``, the power taken by squaring with
    host-computed factors (float64 products, exact IEEE operations). The same bits on
    every device and executor, and a replay or a restart from a checkpoint (which keeps
    the table's step) admits the same keys. Tables that share a seed draw the same coin
    for the same key at the same step; give tables their own ``seed`` to decorrelate them.

    Args:
        probability: float in [0, 1]: the chance of admission per occurrence.
        initializer_args: rows of keys not admitted (``None``: the table's own
            ``initializer_args``, so a key keeps the row it will start from).
        seed: int64, mixed into every draw.

    Raises:
        TypeError / ValueError: on a bad argument, naming it and its value.

    Example::

        >>> s = ProbabilisticAdmissionStrategy(probability=0.1)
        >>> s.admit(torch.arange(100_000), torch.ones(100_000, dtype=torch.int64)).sum()
        tensor(9910)
    """

    counts_keys = False

    def __init__(
        self,
        probability: float,
        initializer_args: DynamicEmbInitializerArgs | None = None,
        seed: int = 0,
    ) -> None:
        if not isinstance(probability, (int, float)) or isinstance(probability, bool):
            raise TypeError(
                f"ProbabilisticAdmissionStrategy: probability must be a float, got {probability!r}"
            )
        if not 0.0 <= float(probability) <= 1.0:
            raise ValueError(
                f"ProbabilisticAdmissionStrategy: probability must be in [0, 1], got {probability}"
            )
        if initializer_args is not None:
            if not isinstance(initializer_args, DynamicEmbInitializerArgs):
                raise TypeError(
                    "ProbabilisticAdmissionStrategy: initializer_args must be "
                    f"DynamicEmbInitializerArgs or None, got {initializer_args!r}"
                )
            initializer_args.validate()
        if not isinstance(seed, int) or isinstance(seed, bool) or not -(2**63) <= seed < 2**63:
            raise ValueError(f"ProbabilisticAdmissionStrategy: seed must be an int64, got {seed!r}")
        self.probability = float(probability)
        self.initializer_args = initializer_args
        self.seed = seed

    def admit(self, keys: torch.Tensor, frequencies: torch.Tensor, step: int = 0) -> torch.Tensor:
        """(n,) bool: the keys admitted at table step ``step``; ``frequencies`` (n,)
        int64 are their occurrences in the batch (k; k <= 0 is never admitted)."""
        if keys.numel() == 0:
            return torch.zeros_like(keys, dtype=torch.bool)
        u = admission_draws(keys, self.seed, step)
        return u < 1.0 - _power(1.0 - self.probability, frequencies.to(keys.device))

    def admit_at(self, keys: torch.Tensor, frequencies: torch.Tensor, step: int) -> torch.Tensor:
        return self.admit(keys, frequencies, step)

    def get_initializer_args(self) -> DynamicEmbInitializerArgs | None:
        return self.initializer_args

    def get_grouped_key(self) -> tuple:
        """What two tables must agree on to share a module (DynamicEmb's grouping key)."""
        mode = None if self.initializer_args is None else self.initializer_args.mode
        return (type(self), self.probability, mode, self.seed)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ProbabilisticAdmissionStrategy):
            return NotImplemented
        return self.get_grouped_key() == other.get_grouped_key()

    def __hash__(self) -> int:
        return hash(self.get_grouped_key())

    def __repr__(self) -> str:
        return (
            f"ProbabilisticAdmissionStrategy(probability={self.probability}, "
            f"initializer_args={self.initializer_args!r}, seed={self.seed})"
        )


_M64 = (1 << 64) - 1
_GAMMA = 0x9E3779B97F4A7C15  # splitmix64's increment and finaliser constants
_MIX1, _MIX2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB


def _signed(v: int) -> int:
    v &= _M64
    return v - (1 << 64) if v >= 1 << 63 else v


def _mix_host(v: int) -> int:
    """splitmix64's finaliser on a Python int (mod 2**64)."""
    v &= _M64
    v = ((v ^ (v >> 30)) * _MIX1) & _M64
    v = ((v ^ (v >> 27)) * _MIX2) & _M64
    return v ^ (v >> 31)


def _shr(x: torch.Tensor, s: int) -> torch.Tensor:
    """Logical right shift of int64 (torch's >> is arithmetic)."""
    return (x >> s) & ((1 << (64 - s)) - 1)


def _mix(x: torch.Tensor) -> torch.Tensor:
    """``_mix_host`` on an int64 tensor: int64 products wrap mod 2**64 on every device."""
    x = (x ^ _shr(x, 30)) * _signed(_MIX1)
    x = (x ^ _shr(x, 27)) * _signed(_MIX2)
    return x ^ _shr(x, 31)


def admission_draws(keys: torch.Tensor, seed: int, step: int) -> torch.Tensor:
    """(n,) float64 in [0, 1): the uniform draw of each key at (seed, step), a pure
    function of them (the salt is mixed on the host, the keys by torch integer ops)."""
    salt = _mix_host(_mix_host(seed * _GAMMA) + (step + 1) * _GAMMA)
    h = _mix(_mix(keys) ^ _signed(salt))
    return _shr(h, 11).to(torch.float64) * 2.0**-53  # 53 bits: exact in float64


def _power(q: float, k: torch.Tensor) -> torch.Tensor:
    """(n,) float64 ``q ** k`` (k int64; k <= 0 gives 1) by squaring: the factors
    q ** (2 ** i) computed on the host, multiplied in bit order, so every device rounds
    the same products."""
    k = k.clamp(min=0, max=2**32 - 1)
    out = torch.ones(k.shape, dtype=torch.float64, device=k.device)
    factor = q
    for i in range(32):
        if factor == 1.0:  # q == 1 (probability 0 or below float64's resolution)
            break
        if factor == 0.0:  # q ** (2 ** i) underflows: every k >= 2 ** i gives 0
            out.masked_fill_(k >= (1 << i), 0.0)
            break
        bit = ((k >> i) & 1).bool()
        out = torch.where(bit, out * factor, out)
        factor *= factor
    return out


def _describe(x) -> str:
    if isinstance(x, torch.Tensor):
        return f"a {x.dim()}-D {x.dtype} tensor"
    return repr(x)
