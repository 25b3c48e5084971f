"""A source built from tensors holds their values at construction: editing the caller's
weight, state or ids in place afterwards (or training the static model a state dict
came from) does not change the rows later lookups read."""

import torch

from dynemb import ScoredHashTable
from dynemb.warm_start import TableFill, WarmStart
from tests.support.static_models import dynamic_twin, static_model, train_static


def _table(source, device, state_columns=0):
    table = ScoredHashTable(dim=4, capacity=64, bucket_capacity=16, extra_columns=state_columns,
                            device=device)  # fmt: skip
    table.warm_start = TableFill(source, 4, state_columns, torch.float32, "t")
    return table


def test_in_place_edits_after_construction_are_not_read(device):
    weight, state = torch.randn(10, 4), torch.randn(10, 1)
    want = torch.cat([weight, state], 1)[2:8]
    keys = torch.arange(2, 8, device=device)
    ids = torch.arange(10)
    sources = {
        "identity": WarmStart.from_tensor(weight, state=state),
        "modulo": WarmStart.from_tensor(weight, "modulo", state=state),
        "function": WarmStart.from_tensor(weight, lambda k: k, state=state),
        "ids": WarmStart.from_tensor(weight, ids, state=state),
    }
    tables = {name: _table(source, device, 1) for name, source in sources.items()}
    weight.add_(1.0)
    state.zero_()
    ids.copy_(ids.flip(0))
    for name, table in tables.items():
        table.find_or_insert_slots(keys)
        got = table.find_entries(keys)[0].cpu()
        assert torch.equal(got, want), name


def test_training_the_static_model_afterwards_changes_no_warm_row(device):
    static = static_model()
    state = static.state_dict()
    want = state["embedding_bags.t0.weight"].clone()
    dynamic = dynamic_twin({"t0": WarmStart.from_state_dict(state, "t0")}, device)
    train_static(static, 2, torch.Generator().manual_seed(0))
    assert not torch.equal(static.state_dict()["embedding_bags.t0.weight"], want)
    keys = torch.arange(50, device=device)
    assert torch.equal(dynamic.tables[0].find_or_insert(keys).cpu(), want)
