"""One forward of BatchedDynamicEmbeddingTables gives at most one optimizer update:
a second backward through it raises, and the forward's mode (train / eval), not
the module's mode at backward time, decides whether its backward updates."""

import pytest
import torch

from dynemb import (
    BatchedDynamicEmbeddingTables,
    DynamicEmbInitializerArgs,
    DynamicEmbInitializerMode,
    DynamicEmbTableOptions,
)
from dynemb.optimizer import EmbOptimType

DEBUG = DynamicEmbInitializerArgs(mode=DynamicEmbInitializerMode.DEBUG)
INDICES, OFFSETS = torch.tensor([1, 2, 3, 1]), torch.tensor([0, 2, 4])
KEYS = torch.tensor([1, 2, 3])


def make():
    opts = DynamicEmbTableOptions(
        dim=4, max_capacity=64, bucket_capacity=16, initializer_args=DEBUG
    )
    return BatchedDynamicEmbeddingTables(
        [opts], [0], optimizer=EmbOptimType.EXACT_ADAGRAD, learning_rate=0.5
    )


def state(m):
    rows, found = m.tables[0].find(KEYS)
    return rows.clone(), found.clone(), m.step


def trained_once():
    """The oracle: rows and step after one ordinary training step."""
    m = make()
    (m(INDICES, OFFSETS) ** 2).sum().backward()
    return state(m)


def assert_state(m, expected):
    rows, found, step = state(m)
    assert torch.equal(found, expected[1]) and step == expected[2]
    assert torch.equal(rows, expected[0])


def test_a_second_backward_through_one_forward_raises():
    """The update is applied once: a second backward is refused, the state unchanged."""
    m = make()
    loss = (m(INDICES, OFFSETS) ** 2).sum()
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="second backward through the same forward"):
        loss.backward()
    assert_state(m, trained_once())


def test_eval_after_a_training_forward_still_applies_its_update():
    """The update and the step both happen: eval() between forward and backward drops
    neither."""
    m = make()
    loss = (m(INDICES, OFFSETS) ** 2).sum()
    m.eval()
    loss.backward()
    assert_state(m, trained_once())


def test_an_eval_forward_backward_is_a_no_op_even_after_train():
    m = make()
    (m(INDICES, OFFSETS) ** 2).sum().backward()
    expected = state(m)
    m.eval()
    loss = (m(INDICES, OFFSETS) ** 2).sum()
    m.train()
    loss.backward(retain_graph=True)
    loss.backward()  # no update, so a second one is harmless
    assert_state(m, expected)
