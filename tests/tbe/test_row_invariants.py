"""Three invariants of training rows, over random configurations, against a shadow of
the table's stored rows:

1. a lookup reads its own key's row (its stored row, or the row it starts from);
2. a row changes only by its own key's gradient;
3. a stored row persists between batches unless a key new to the table took its place.

With EXACT_SGD at learning rate 1, no pooling and loss ``sum(out)``, each lookup that
trains moves its key's row by exactly -1 per element, so the shadow predicts every
row. Random over strategies, capacities, bucket sizes, tiers (in memory, hybrid,
caching), admission and 1-4 forwards before one backward (towers); the sharded
tables' index dedup, on 1 and 2 gloo ranks, is in test_row_invariants_sharded.py.
"""

import dataclasses

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import dynemb
from dynemb import (
    DynamicEmbCheckMode,
    DynamicEmbInitializerArgs,
    DynamicEmbInitializerMode,
    DynamicEmbPoolingMode,
    DynamicEmbScoreStrategy,
    DynamicEmbTableOptions,
    FrequencyAdmissionStrategy,
    KVCounter,
)
from dynemb.optimizer import EmbOptimType
from dynemb.tiering import CachedTable

S = DynamicEmbScoreStrategy
DIM = 4
UNIFORM = DynamicEmbInitializerArgs(mode=DynamicEmbInitializerMode.UNIFORM, lower=-1.0, upper=1.0)
TIERS = ("memory", "hybrid", "caching")
STRATEGIES = [S.LFU, S.TIMESTAMP, S.STEP, (S.TIMESTAMP, S.LFU)]


@dataclasses.dataclass(frozen=True)
class Config:
    strategy: object
    buckets: int
    bucket: int
    tier: str
    admission: bool
    forwards: int

    @property
    def capacity(self) -> int:
        return self.buckets * self.bucket

    def options(self, capacity=None, tier=None) -> DynamicEmbTableOptions:
        extra = {}
        tier = tier or self.tier
        if tier == "hybrid":  # half the rows in the fast tier
            extra["local_hbm_for_values"] = self.capacity // 2 * DIM * 4
        elif tier == "caching":  # a cache of one bucket in front of the whole table
            extra.update(caching=True, local_hbm_for_values=self.bucket * DIM * 4)
        if self.admission:
            extra.update(
                admit_strategy=FrequencyAdmissionStrategy(
                    2, counter=KVCounter(capacity=1024, bucket_capacity=128)
                ),
            )
        return DynamicEmbTableOptions(
            dim=DIM, max_capacity=capacity or self.capacity, bucket_capacity=self.bucket,
            score_strategy=self.strategy, initializer_args=UNIFORM,
            safe_check_mode=DynamicEmbCheckMode.IGNORE, seed=3, **extra,
        )  # fmt: skip

    def module(self, options=None) -> dynemb.BatchedDynamicEmbeddingTables:
        return dynemb.BatchedDynamicEmbeddingTables(
            [options or self.options()], [0], pooling_mode=DynamicEmbPoolingMode.NONE,
            optimizer=EmbOptimType.EXACT_SGD, learning_rate=1.0,
        )  # fmt: skip


def initial_rows(config: Config, keys: torch.Tensor) -> torch.Tensor:
    """The row each key starts from: a function of (seed, key), read from a table that
    evicts nothing."""
    big = dataclasses.replace(config, admission=False)
    module = big.module(big.options(capacity=1 << 14, tier="memory"))
    with torch.no_grad():
        return module(keys, torch.arange(keys.numel() + 1))


def stored(module) -> dict[int, torch.Tensor]:
    """Every stored key's row; a cached table's: its storage, cache and staged rows,
    the later winning."""
    table = module.tables[0]
    if isinstance(table, CachedTable):
        table.sync()
        storage, end, offset, out = table.storage, table.storage.end_offset(), 0, {}
        while offset < end:
            keys, rows, _, offset = storage.export_batch(offset, 1024)
            out.update({int(k): r[:DIM].clone() for k, r in zip(keys, rows, strict=True)})
        cache = table.cache  # a cached row may have left a full storage
        keys, rows, _, _ = cache.export_batch(0, cache.capacity())
        out.update({int(k): r[:DIM].clone() for k, r in zip(keys, rows, strict=True)})
        keys, rows, _ = table.state.staging.entries()  # held by batches in flight: the truth
        out.update({int(k): r[:DIM].clone() for k, r in zip(keys, rows, strict=True)})
        return out
    keys, values, _, _ = table.export_batch(0, table.capacity())
    return {int(k): v.clone() for k, v in zip(keys, values, strict=True)}


def check_step(config, batches, outs, stored_before, after, inits):
    """The three invariants over one step of ``len(batches)`` forwards and one backward;
    ``stored_before[f]``: the stored rows before forward f (an earlier forward of the
    step may have evicted keys that no forward had looked up yet)."""
    trained, start = {}, {}
    for keys, out, init, before in zip(batches, outs, inits, stored_before, strict=True):
        for i, k in enumerate(keys.tolist()):
            row = out[i].detach()
            if k in before:  # (1) its stored row (rows change only in the backward)
                assert torch.equal(row, before[k]), f"key {k}: not its stored row"
                start.setdefault(k, before[k])
            elif k in after or config.admission:  # (1) the row it starts from
                assert torch.equal(row, init[i]), f"key {k}: not its initial row"
                start.setdefault(k, init[i])
            elif config.tier == "caching":  # staged, then dropped by a full storage
                assert torch.equal(row, init[i]) or not row.any(), f"key {k}: a foreign row"
                continue
            else:  # not stored: the eval initializer's row, and no training
                assert not row.any(), f"key {k} (not stored): not the eval initializer's row"
                continue
            trained[k] = trained.get(k, 0) + 1
    first = stored_before[0]
    for k, row in after.items():
        if k in trained:  # (2) moved by its own lookups only: -1 per element each
            # admission: lookups before the key's admission do not train
            moves = range(trained[k] + 1) if config.admission else [trained[k]]
            # atol: each forward's backward updates the row on its own (several forwards:
            # several roundings), and a foreign gradient moves it by at least 1
            assert any(torch.allclose(row, start[k] - c, rtol=0, atol=1e-4) for c in moves), (
                f"key {k}: {row.tolist()} is not {start[k].tolist()} moved by its "
                f"{trained[k]} lookups"
            )
        else:  # (3) not looked up: unchanged, and present only if stored before
            assert k in first, f"key {k}: stored without a lookup"
            assert torch.equal(row, first[k]), f"key {k}: changed without a lookup"
    left = first.keys() - after.keys()
    arrived = after.keys() - first.keys()
    assert len(left) <= len(arrived), f"{len(left)} keys left, {len(arrived)} arrived"


def train_checked(config: Config, seed: int, steps: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    module = config.module()
    span = 3 * config.capacity
    for _ in range(steps):
        batches = []
        for _ in range(config.forwards):
            n = int(torch.randint(1, 2 * config.capacity, (1,), generator=gen))
            batches.append(torch.randint(0, span, (n,), generator=gen) * 7 - span)
        inits = [initial_rows(config, keys) for keys in batches]
        outs, stored_before = [], []
        for keys in batches:
            stored_before.append(stored(module))
            outs.append(module(keys, torch.arange(keys.numel() + 1)))
        sum(out.sum() for out in outs).backward()
        check_step(config, batches, outs, stored_before, stored(module), inits)


# The emulated pass draws fewer configurations: its kernels make the CPU executor's
# decisions (the parity suite holds them bit for bit), and each pass draws anew.
EXAMPLES = 50 if dynemb.executor() == "cuda-emulated" else 150


@settings(max_examples=EXAMPLES, deadline=None)
@given(
    strategy=st.sampled_from(STRATEGIES),
    buckets=st.integers(1, 4),
    bucket=st.sampled_from([16, 32]),
    tier=st.sampled_from(TIERS),
    admission=st.booleans(),
    forwards=st.integers(1, 4),
    seed=st.integers(0, 10**6),
    steps=st.integers(1, 4),
)
def test_rows_stay_their_keys_own(strategy, buckets, bucket, tier, admission, forwards, seed, steps):  # fmt: skip
    if tier == "caching":  # caching mode has neither admission nor compound strategies
        admission, strategy = False, strategy if isinstance(strategy, S) else S.TIMESTAMP
    config = Config(strategy, buckets, bucket, tier, admission, forwards)
    train_checked(config, seed, steps)


def test_every_tier_with_four_towers():
    """The corners the random draw may miss: each tier, four forwards, a full table."""
    for tier in TIERS:
        for admission in (False, True) if tier != "caching" else (False,):
            train_checked(Config(S.LFU, 2, 16, tier, admission, 4), seed=11, steps=3)
