"""BatchedDynamicEmbeddingTables takes strided views of its inputs (indices, offsets,
per_sample_weights, access_counts): a view gives the output, gradients and table of its
contiguous copy, in training and in eval."""

import pytest
import torch

from dynemb import (
    BatchedDynamicEmbeddingTables,
    DynamicEmbInitializerArgs,
    DynamicEmbInitializerMode,
    DynamicEmbPoolingMode,
    DynamicEmbScoreStrategy,
    DynamicEmbTableOptions,
)

DEBUG = DynamicEmbInitializerArgs(mode=DynamicEmbInitializerMode.DEBUG)  # row = float(key)


def make(device, feature_table_map, pooling):
    opts = DynamicEmbTableOptions(
        dim=4, max_capacity=256, bucket_capacity=16, initializer_args=DEBUG,
        score_strategy=DynamicEmbScoreStrategy.LFU,
    )  # fmt: skip
    return BatchedDynamicEmbeddingTables(
        [opts], feature_table_map=feature_table_map, pooling_mode=pooling,
        learning_rate=0.5, device=device,
    )  # fmt: skip


def snapshot(m):
    t = m.tables[0]
    k, v, s, _ = t.export_batch(0, t.capacity(), include_extra=True)
    order = torch.argsort(k)
    return k[order], v[order], s[order]


def every_other(x: torch.Tensor) -> torch.Tensor:
    """A non-contiguous view holding ``x``: ``big[::2]`` of a tensor twice as long."""
    big = torch.zeros(2 * x.numel(), dtype=x.dtype, device=x.device)
    big[::2] = x
    view = big[::2]
    assert not view.is_contiguous() and torch.equal(view, x)
    return view


@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("features", [1, 2], ids=["one_feature", "two_features"])
@pytest.mark.parametrize(
    "pooling", [DynamicEmbPoolingMode.SUM, DynamicEmbPoolingMode.NONE], ids=["sum", "none"]
)
@pytest.mark.parametrize("extras", ["plain", "weighted", "access_counts"])
def test_strided_batch_matches_its_contiguous_copy(device, train, features, pooling, extras):
    if extras == "weighted" and pooling == DynamicEmbPoolingMode.NONE:
        pytest.skip("NONE pooling takes no per-sample weights")
    indices = torch.arange(0, 40, 2, device=device) % 14  # 20 keys, some repeated
    bags = 4  # B * T bags of 5 keys
    offsets = torch.arange(0, 21, 20 // bags, device=device)
    weights = torch.linspace(-1.0, 2.0, 20, device=device) if extras == "weighted" else None
    counts = (torch.arange(20, device=device) % 3 + 1) if extras == "access_counts" else None
    batch = {"per_sample_weights": weights, "access_counts": counts}
    strided = {k: None if v is None else every_other(v) for k, v in batch.items()}
    fmap = [0] * features
    models = [make(device, fmap, pooling) for _ in "ab"]
    if not train:  # eval reads what training stored: give both tables the same rows
        for m in models:
            m(indices, offsets).sum().backward()
    outputs = []
    for m, (keys, offs, extra) in zip(
        models, [(indices, offsets, batch), (every_other(indices), every_other(offsets), strided)]
    ):
        m.train(train)
        out = m(keys, offs, **extra)
        if train:
            out.backward(torch.linspace(-1.0, 1.0, out.numel(), device=device).view(out.shape))
        outputs.append(out.detach())
    assert torch.equal(outputs[0], outputs[1])
    for a, b in zip(snapshot(models[0]), snapshot(models[1]), strict=True):
        assert torch.equal(a, b)
