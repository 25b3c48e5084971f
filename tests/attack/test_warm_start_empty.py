"""A warm-start source over an empty (0, dim) weight holds no key: under the identity,
a function or ids, training reads the initializer's rows, as without a source (it used
to crash the first training lookup after the batch's keys were stored); under
``"modulo"``, which has no row to map a key to, it is refused when built."""

import pytest
import torch

from dynemb.warm_start import WarmStart
from tests.support.static_models import TABLES, batch, dynamic_twin

DIM = TABLES["t0"][1]
EMPTY = torch.empty(0, DIM)


def _train(module, steps: int = 2) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    outs = []
    for _ in range(steps):
        _, indices, offsets = batch(g)
        out = module(indices, offsets)
        out.sum().backward()
        outs.append(out.detach())
    return outs


def _contents(module) -> tuple[torch.Tensor, torch.Tensor]:
    t = module.tables[0]
    keys, values, _, _ = t.export_batch(0, t.capacity())
    order = torch.argsort(keys)
    return keys[order], values[order]


@pytest.mark.parametrize(
    "source",
    [
        WarmStart.from_tensor(EMPTY),
        WarmStart.from_tensor(EMPTY, ids="identity", state=torch.empty(0, 1)),
        WarmStart.from_tensor(EMPTY, ids=lambda keys: keys),
        WarmStart.from_tensor(EMPTY, ids=torch.empty(0, dtype=torch.int64)),
        WarmStart.from_tensor(torch.empty(0, 2 * DIM)).columns(DIM, DIM),
    ],
    ids=["identity", "identity-with-state", "function", "ids", "column-slice"],
)
def test_an_empty_source_trains_as_no_source(source):
    warm, plain = dynamic_twin({"t0": source}), dynamic_twin({})
    for a, b in zip(_train(warm), _train(plain), strict=True):
        assert torch.equal(a, b)
    for a, b in zip(_contents(warm), _contents(plain), strict=True):
        assert torch.equal(a, b)
    assert warm.tables[0].size() > 0
    rows = source.rows(torch.tensor([0, 1, 7]))
    assert rows.found.tolist() == [False, False, False]
    assert rows.values.shape == (3, DIM)


def test_an_empty_weight_under_modulo_is_refused_when_built():
    with pytest.raises(
        ValueError,
        match=r"WarmStart: `weight` must have rows under ids='modulo' .*got a \(0, 8\) tensor",
    ):
        WarmStart.from_tensor(EMPTY, ids="modulo")
