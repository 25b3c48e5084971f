"""Optimizer hyper-parameters must be finite numbers: refused at construction, in
set_learning_rate, and (a one-element tensor learning rate may be changed in place)
before each backward, with nothing updated."""

import numpy as np
import pytest
import torch

from dynemb import (
    BatchedDynamicEmbeddingTables,
    DynamicEmbInitializerArgs,
    DynamicEmbInitializerMode,
    DynamicEmbTableOptions,
)
from dynemb.optimizer import EmbOptimType

INF, NAN = float("inf"), float("nan")
DEBUG = DynamicEmbInitializerArgs(mode=DynamicEmbInitializerMode.DEBUG)
INDICES, OFFSETS = torch.tensor([1, 2, 3]), torch.tensor([0, 2, 3])


def make(**kw):
    opts = DynamicEmbTableOptions(
        dim=4, max_capacity=64, bucket_capacity=16, initializer_args=DEBUG
    )
    return BatchedDynamicEmbeddingTables([opts], [0], optimizer=EmbOptimType.ADAM, **kw)


def rows(m):
    return m.tables[0].find(INDICES)[0].clone()


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(learning_rate=INF), "learning_rate must be a finite number.*got inf"),
        (dict(learning_rate=NAN), "learning_rate must be a finite number.*got nan"),
        (dict(eps=INF), "eps must be a finite number.*got inf"),
        (dict(eps=NAN), "eps must be a finite number.*got nan"),
        (dict(beta1=NAN), "beta1 must be a finite number.*got nan"),
        (dict(beta2=-INF), "beta2 must be a finite number.*got -inf"),
        (dict(weight_decay=INF), "weight_decay must be a finite number.*got inf"),
        (
            dict(learning_rate=torch.tensor([0.1, 0.2])),
            "learning_rate must be a number or a one-element",
        ),
        (dict(learning_rate="0.1"), "learning_rate must be a finite number, got '0.1'"),
        (dict(weight_decay=10**400), "weight_decay must be a finite number"),
    ],
)
def test_non_finite_hyper_parameters_are_refused_at_construction(kwargs, match):
    with pytest.raises(ValueError, match=match):
        make(**kwargs)


@pytest.mark.parametrize("lr", [INF, NAN, torch.tensor(INF), -1.0])
def test_set_learning_rate_refuses_non_finite_values(lr):
    m = make(learning_rate=0.1)
    with pytest.raises(ValueError, match="learning_rate must be"):
        m.set_learning_rate(lr)
    assert m.get_learning_rate() == 0.1


def test_numpy_and_int_hyper_parameters_are_accepted():
    m = make(learning_rate=np.float32(0.5), eps=np.float64(1e-6), weight_decay=0)
    m.set_learning_rate(np.float32(0.25))
    assert m.get_learning_rate() == 0.25


def test_a_one_element_tensor_learning_rate_is_read_at_each_backward():
    lr = torch.tensor(0.5)
    m = make(learning_rate=lr)
    m(INDICES, OFFSETS).sum().backward()
    assert m.step == 1
    lr.fill_(INF)  # a scheduler writing in place
    out = m(INDICES, OFFSETS)
    before = rows(m)
    with pytest.raises(ValueError, match="learning_rate must be a finite number.*got inf"):
        out.sum().backward()
    assert torch.equal(rows(m), before) and m.step == 1  # nothing updated, step kept
    lr.fill_(0.25)
    m(INDICES, OFFSETS).sum().backward()
    assert m.step == 2 and not torch.equal(rows(m), before)
    m.set_learning_rate(torch.tensor([0.125]))  # one element, any shape
    assert m.get_learning_rate() == 0.125
