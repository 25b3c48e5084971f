"""Every scalar a load of DynamicEmb's layout restores from ``opt_args.json`` is checked,
before any table changes, against what the model can train with: the table's step (a
DECAYED_LFU table's next step must not pass the core's MAX_DECAY_STEP; any table's
must fit an int64), Adam's step, and the hyper-parameters that replace the model's.
A forged ``step_score`` of 2**60 is refused at load, not by every step after it."""

import json

import pytest
import torch

from dynemb import (
    BatchedDynamicEmbeddingTables,
    CheckpointError,
    DynamicEmbDump,
    DynamicEmbLoad,
    DynamicEmbScoreStrategy,
    DynamicEmbTableOptions,
    _ops,
)
from dynemb.optimizer import EmbOptimType
from tests.support.checkpoint_tables import edit_manifest

INT64_MAX = 2**63 - 1
KEYS = torch.arange(1, 17)
DECAYED = DynamicEmbScoreStrategy.DECAYED_LFU


def _module(strategy=DECAYED, optimizer=EmbOptimType.ADAM):
    options = DynamicEmbTableOptions(
        dim=4,
        max_capacity=256,
        score_strategy=strategy,
        score_half_life_steps=10 if strategy == DECAYED else None,
    )
    return BatchedDynamicEmbeddingTables(
        [options], [0], table_names=["t"], optimizer=optimizer, learning_rate=0.1
    )


def _train(module, keys=KEYS):
    module(keys, torch.arange(keys.numel() + 1)).sum().backward()


def _forged(tmp_path, strategy, **fields):
    """A dump of a trained table whose opt_args.json then gets ``fields``."""
    trained = _module(strategy)
    _train(trained)
    DynamicEmbDump(tmp_path / "ckpt", trained, format="dynamicemb", optim=True)
    file = tmp_path / "ckpt" / "model" / "t_opt_args.json"
    args = json.loads(file.read_text())
    args.update(fields)
    file.write_text(json.dumps(args))
    return file


def _state(module):
    t = module.tables[0]
    keys, values, scores, _ = t.export_batch(0, t.capacity(), include_extra=True)
    order = torch.argsort(keys)
    config = module.optimizer_config
    hyper = (config.learning_rate, config.beta1, config.beta2, config.eps, config.weight_decay)
    return keys[order], values[order], scores[order], t.score_step, module.step, hyper


def _assert_refused(tmp_path, strategy, field, value, message):
    file = _forged(tmp_path, strategy, **{field: value})
    module = _module(strategy)
    _train(module, torch.tensor([100, 101, 100]))
    before = _state(module)
    with pytest.raises(CheckpointError, match=message) as refused:
        DynamicEmbLoad(tmp_path / "ckpt", module, optim=True)
    assert str(file) in str(refused.value)
    after = _state(module)
    for a, b in zip(before, after, strict=True):
        assert torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b
    _train(module)  # and it still trains


@pytest.mark.parametrize("value", [2**60, _ops.MAX_DECAY_STEP, -1])
def test_a_decayed_table_step_out_of_range_is_refused(tmp_path, value):
    high = _ops.MAX_DECAY_STEP - 1
    message = rf"step_score must be an integer in \[0, {high}\].*DECAYED_LFU.*got {value}\b"
    _assert_refused(tmp_path, DECAYED, "step_score", value, message)


@pytest.mark.parametrize(
    "strategy, field, value",
    [
        (DynamicEmbScoreStrategy.LFU, "step_score", INT64_MAX),
        (DynamicEmbScoreStrategy.STEP, "step_score", INT64_MAX),
        (DECAYED, "iters", INT64_MAX),
        (DECAYED, "iters", -3),
    ],
)
def test_a_step_whose_next_step_overflows_is_refused(tmp_path, strategy, field, value):
    message = rf"{field} must be an integer in \[0, {INT64_MAX - 1}\].*got {value}\b"
    _assert_refused(tmp_path, strategy, field, value, message)


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("beta1", 1.5, r"beta1 must be in \[0, 1\), got 1.5"),
        ("lr", -0.5, r"learning_rate must be >= 0, got -0.5"),
        ("eps", 0, r"eps must be > 0, got 0"),
        ("weight_decay", float("nan"), r"weight_decay must be a finite number, got nan"),
    ],
)
def test_hyper_parameters_the_optimizer_refuses_are_refused(tmp_path, field, value, message):
    _assert_refused(tmp_path, DECAYED, field, value, rf"opt_args.json: {field} .*{message}")


@pytest.mark.parametrize(
    "strategy, field, value",
    [
        (DECAYED, "step_score", _ops.MAX_DECAY_STEP - 1),
        (DynamicEmbScoreStrategy.STEP, "step_score", INT64_MAX - 1),
        (DECAYED, "iters", INT64_MAX - 1),
    ],
)
def test_a_step_at_the_maximum_loads_and_trains_a_step(tmp_path, strategy, field, value):
    _forged(tmp_path, strategy, **{field: value})
    module = _module(strategy)
    DynamicEmbLoad(tmp_path / "ckpt", module, optim=True)
    before = module.tables[0].score_step if field == "step_score" else module.step
    assert before == value
    _train(module)
    assert module.tables[0].score_step == (value + 1 if field == "step_score" else 2)
    assert module.step == (value + 1 if field == "iters" else 2)


@pytest.mark.parametrize(
    "strategy, field, value, high",
    [
        (DECAYED, "table_step", 2**60, _ops.MAX_DECAY_STEP - 1),
        (DECAYED, "table_step", _ops.MAX_DECAY_STEP, _ops.MAX_DECAY_STEP - 1),
        (DynamicEmbScoreStrategy.LFU, "table_step", INT64_MAX, INT64_MAX - 1),
        (DECAYED, "optimizer_step", INT64_MAX, INT64_MAX - 1),
    ],
)
def test_dynembs_own_format_checks_the_steps_too(tmp_path, strategy, field, value, high):
    """The manifest's steps (a hostile writer recomputes its checksum): refused before
    any table changes, the model still trains."""
    trained = _module(strategy)
    _train(trained)
    DynamicEmbDump(tmp_path / "ckpt", trained, optim=True)
    edit_manifest(tmp_path / "ckpt", lambda m: m["tables"]["t"].update({field: value}))
    module = _module(strategy)
    _train(module, torch.tensor([100, 101, 100]))
    before = _state(module)
    message = rf"table 't': the checkpoint's {field} must be in \[0, {high}\].*got {value}\b"
    with pytest.raises(CheckpointError, match=message):
        DynamicEmbLoad(tmp_path / "ckpt", module, optim=True)
    for a, b in zip(before, _state(module), strict=True):
        assert torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b
    _train(module)
