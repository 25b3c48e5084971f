"""A serving table that follows training: training publishes a base checkpoint and a
delta every k steps (small tables that evict, and an explicit erase, so tombstones
occur); a serving module loads the base and replays the deltas; its lookups equal the
training tables' eval lookups exactly for every key ever seen, evicted keys included."""

import pytest
import torch

from dynemb import (
    BatchedDynamicEmbeddingTables,
    DynamicEmbPoolingMode,
    DynamicEmbScoreStrategy,
    DynamicEmbTableOptions,
)
from dynemb.deltas import DeltaPublisher, delta_path, read_delta
from dynemb.inference.exportable_tables import InferenceEmbeddingCollection
from dynemb.optimizer import DynamicEmbOptimType, EmbOptimType

DIM = 4
STEPS, EVERY = 24, 4
STRATEGIES = {
    "lfu_step": (DynamicEmbScoreStrategy.LFU, DynamicEmbScoreStrategy.STEP),
    "timestamp_lfu": ((DynamicEmbScoreStrategy.TIMESTAMP, DynamicEmbScoreStrategy.LFU),) * 2,
    "decayed_lfu": (
        DynamicEmbScoreStrategy.DECAYED_LFU,
        (DynamicEmbScoreStrategy.TIMESTAMP, DynamicEmbScoreStrategy.DECAYED_LFU),
    ),
}


def _options(strategies) -> list[DynamicEmbTableOptions]:
    out = []
    for i, strategy in enumerate(strategies):
        decays = DynamicEmbScoreStrategy.DECAYED_LFU in (
            strategy if isinstance(strategy, tuple) else (strategy,)
        )
        o = DynamicEmbTableOptions(
            dim=DIM, max_capacity=32, bucket_capacity=16, score_strategy=strategy, seed=3 + i,
            score_half_life_steps=3 if decays else None,
        )  # fmt: skip
        o.eval_initializer_args.value = 0.5 + i  # evicted keys must read this back
        out.append(o)
    return out


def _batch(step: int) -> torch.Tensor:
    """2 features x 16 single-key bags from a key space (~200) far above capacity (32)."""
    g = torch.Generator().manual_seed(step)
    return torch.randint(-100, 100, (32,), generator=g)


def _lookup(module, keys: torch.Tensor) -> torch.Tensor:
    """Each key looked up in both tables (feature 0 -> a, feature 1 -> b)."""
    both = torch.cat([keys, keys])
    return module(both, torch.arange(both.numel() + 1))


OPTIMIZERS = {
    "adam": {"optimizer": EmbOptimType.ADAM},
    "ftrl": {"optimizer": DynamicEmbOptimType.FTRL, "l1_reg": 0.01, "ftrl_beta": 1.0,
             "initial_accumulator_value": 0.1},
}  # fmt: skip


@pytest.mark.parametrize("optimizer", list(OPTIMIZERS))
@pytest.mark.parametrize("optim", [False, True])
@pytest.mark.parametrize("strategies", list(STRATEGIES), ids=list(STRATEGIES))
def test_a_serving_table_replays_the_deltas_to_the_training_state(
    tmp_path, strategies, optim, optimizer
):
    options = _options(STRATEGIES[strategies])
    model = BatchedDynamicEmbeddingTables(
        options, [0, 1], pooling_mode=DynamicEmbPoolingMode.NONE, learning_rate=0.1,
        table_names=["a", "b"], **OPTIMIZERS[optimizer],
    )  # fmt: skip
    publisher = DeltaPublisher(model, tmp_path, optim=optim)
    seen = []
    tombstones = 0
    for step in range(1, STEPS + 1):
        keys = _batch(step)
        seen.append(keys)
        model(keys, torch.arange(keys.numel() + 1)).sum().backward()
        if step == 2:
            assert publisher.publish_base() == 0
        if step == 10:  # an explicit erase of stored keys
            assert model.tables[1].erase(keys[16:24]) > 0
        if step > 2 and step % EVERY == 0:
            version = publisher.publish()
            tombstones += sum(
                t.tombstones.numel()
                for t in read_delta(delta_path(tmp_path, version)).tables.values()
            )

    serving = InferenceEmbeddingCollection(
        options, table_names=["a", "b"], feature_table_map=[0, 1]
    )
    serving.load_from_dynamicemb_file(publisher.base_path)
    for version in range(1, publisher.version + 1):
        assert serving.apply_delta(delta_path(tmp_path, version)) == version
    assert serving.delta_version == publisher.version == STEPS // EVERY

    every = torch.unique(torch.cat(seen))
    model.eval()
    with torch.no_grad():
        expected = _lookup(model, every)
    got = _lookup(serving, every)
    assert torch.equal(got, expected)
    assert serving.sizes == [t.size() for t in model.tables]
    # Evicted keys were seen and read the eval initializer, in both.
    a_missing = ~model.tables[0].contains(every)
    assert a_missing.any() and tombstones > 0
    assert torch.equal(
        got[: every.numel()][a_missing], torch.full((int(a_missing.sum()), DIM), 0.5)
    )


def test_a_delta_is_small(tmp_path):
    """A delta holds the keys touched since the previous one, not the table."""
    options = [DynamicEmbTableOptions(dim=DIM, max_capacity=1 << 12)]
    model = BatchedDynamicEmbeddingTables(options, [0], table_names=["t"])
    keys = torch.arange(2000)
    model(keys, torch.arange(keys.numel() + 1)).sum().backward()
    publisher = DeltaPublisher(model, tmp_path)
    publisher.publish_base()
    touched = torch.tensor([5, 7, 11])
    model(touched, torch.arange(4)).sum().backward()
    delta = read_delta(delta_path(tmp_path, publisher.publish())).tables["t"]
    assert delta.tombstones.numel() == 0
    assert torch.equal(delta.keys.sort().values, touched)  # in slot order: a set
    found, _ = model.tables[0].find(delta.keys)
    assert torch.equal(delta.values, found)
