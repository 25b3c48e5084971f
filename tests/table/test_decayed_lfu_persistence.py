"""DECAYED_LFU scores leave and re-enter tables intact: checkpoints of both formats
(training continues with the same scores), deltas, and the incremental dump, whose
reference for decayed scores is the next step's single access (incremental_dump.py)."""

import pytest
import torch

from dynemb import (
    BatchedDynamicEmbeddingTables,
    DynamicEmbDump,
    DynamicEmbLoad,
    DynamicEmbPoolingMode,
    DynamicEmbScoreStrategy,
    DynamicEmbTableOptions,
)
from dynemb.deltas import DeltaPublisher, delta_path, read_delta
from dynemb.incremental_dump import get_score, incremental_dump
from dynemb.optimizer import EmbOptimType
from tests.support import decay_reference as decay

S = DynamicEmbScoreStrategy
DECAYED = {"decayed_lfu": S.DECAYED_LFU, "timestamp_decayed_lfu": (S.DECAYED_LFU, S.TIMESTAMP)}
HALF_LIFE = 4


def _module(strategy, half_life=HALF_LIFE) -> BatchedDynamicEmbeddingTables:
    decays = half_life is not None
    options = DynamicEmbTableOptions(
        dim=4, max_capacity=64, bucket_capacity=16, score_strategy=strategy, seed=5,
        score_half_life_steps=half_life if decays else None,
    )  # fmt: skip
    return BatchedDynamicEmbeddingTables(
        [options], [0], pooling_mode=DynamicEmbPoolingMode.NONE,
        optimizer=EmbOptimType.ADAM, learning_rate=0.1, table_names=["t"],
    )  # fmt: skip


def _batch(step: int) -> torch.Tensor:
    """48 lookups over ~160 ids, skewed to small ids: repeats, evictions at 64 rows."""
    g = torch.Generator().manual_seed(step)
    return (torch.rand(48, generator=g) ** 2 * 160).long()


def _train(module, steps: range) -> set[int]:
    touched = set()
    for step in steps:
        keys = _batch(step)
        module(keys, torch.arange(keys.numel() + 1)).sum().backward()
        touched.update(keys.tolist())
    return touched


def _entries(module):
    table = module.tables[0]
    keys, values, scores, _ = table.export_batch(0, table.capacity(), include_extra=True)
    order = torch.argsort(keys)
    return keys[order], values[order], scores[order]


def _assert_same_entries(a, b):
    for x, y, what in zip(_entries(a), _entries(b), ["keys", "rows", "scores"], strict=True):
        assert torch.equal(x, y), what


@pytest.mark.parametrize("fmt", ["dynemb", "dynamicemb"])
@pytest.mark.parametrize("strategy", list(DECAYED))
def test_a_checkpoint_round_trip_keeps_the_scores_and_training_continues(tmp_path, fmt, strategy):
    saved = _module(DECAYED[strategy])
    _train(saved, range(1, 13))
    assert saved.tables[0].last_stats is not None and saved.tables[0].size() == 64
    DynamicEmbDump(tmp_path / "ckpt", saved, optim=True, format=fmt)
    loaded = _module(DECAYED[strategy])
    DynamicEmbLoad(tmp_path / "ckpt", loaded, optim=True)
    assert loaded.tables[0].score_step == saved.tables[0].score_step
    _assert_same_entries(saved, loaded)
    _train(saved, range(13, 17))  # decays and evicts alike: the same steps, the same scores
    _train(loaded, range(13, 17))
    _assert_same_entries(saved, loaded)


@pytest.mark.parametrize("fmt", ["dynemb", "dynamicemb"])
@pytest.mark.parametrize("into", [(S.DECAYED_LFU, HALF_LIFE + 1), (S.LFU, None)])
def test_a_checkpoint_of_another_half_life_is_refused(tmp_path, fmt, into):
    saved = _module(S.DECAYED_LFU)
    _train(saved, range(1, 4))
    DynamicEmbDump(tmp_path / "ckpt", saved, format=fmt)
    loaded = _module(*into)
    before = _entries(loaded)
    with pytest.raises(Exception, match="score_half_life_steps"):
        DynamicEmbLoad(tmp_path / "ckpt", loaded)
    assert all(torch.equal(x, y) for x, y in zip(before, _entries(loaded), strict=True))


@pytest.mark.parametrize("strategy", list(DECAYED))
def test_a_delta_carries_the_decayed_scores_and_the_half_life(tmp_path, strategy):
    module = _module(DECAYED[strategy])
    _train(module, range(1, 6))
    publisher = DeltaPublisher(module, tmp_path)
    publisher.publish_base()
    _train(module, range(6, 9))
    delta = read_delta(delta_path(tmp_path, publisher.publish())).tables["t"]
    table = module.tables[0]
    assert delta.keys.numel() > 0
    assert torch.equal(delta.scores, table.get_scores(delta.keys))
    if table.keeps_timestamps:
        assert torch.equal(delta.timestamps, table.get_timestamps(delta.keys))
    assert f"score_half_life_steps={HALF_LIFE}" in delta.score_strategy


@pytest.mark.parametrize("strategy", list(DECAYED))
def test_the_incremental_dump_holds_every_key_touched_since_the_reference(strategy):
    module = _module(DECAYED[strategy])
    _train(module, range(1, 11))
    reference = get_score(module)
    first_step = module.tables[0].score_step + 1
    touched = _train(module, range(11, 14))
    dumped, _ = incremental_dump(module, reference, with_scores=True)
    ((keys, _, scores),) = dumped["model"].values()
    stored, _, stored_scores = _entries(module)
    stored_touched = touched & set(stored.tolist())
    assert stored_touched and stored_touched <= set(keys.tolist())
    if module.tables[0].keeps_timestamps:  # by last-access time: exactly the touched keys
        assert set(keys.tolist()) == stored_touched
        return
    # By score: the touched keys, and those whose decayed count at first_step is still
    # at least one access (a score >= first_step in units of 2**-16 step).
    weighs_one = {
        k
        for k, s in zip(stored.tolist(), stored_scores.tolist(), strict=True)
        if s >= first_step << decay.FRACTION_BITS
    }
    assert set(keys.tolist()) == weighs_one | stored_touched
    for k, s in zip(keys.tolist(), scores.tolist(), strict=True):
        assert k in stored_touched or decay.count_of(s, first_step, HALF_LIFE) >= 1
