"""DynamicEmbLoad reads NVIDIA DynamicEmb's checkpoint layout (written here by hand from
DYNAMICEMB_API.md §10), DynamicEmbDump(format="dynamicemb") writes it, and a bad file is
an error naming it before any table changes."""

import json
import time

import pytest
import torch

from dynemb import BatchedDynamicEmbeddingTables, DynamicEmbTableOptions
from dynemb.checkpoint import CheckpointError, DynamicEmbDump, DynamicEmbLoad
from dynemb.optimizer import EmbOptimType
from dynemb.types import DynamicEmbScoreStrategy as S
from tests.support.dynamicemb_files import read_table, write_table

pytestmark = pytest.mark.no_emulated_pass(
    "file format: the layout's readers and writers are Python"
)

ADAM_ARGS = {"opt_type": "adam", "lr": 0.02, "iters": 17, "beta1": 0.8, "beta2": 0.99,
             "eps": 1e-6, "weight_decay": 0.0, "dist_type": "roundrobin"}  # fmt: skip
KEYS = [3, 10, -5, 1 << 40, (1 << 63) - 1, -(1 << 63)]


def _model(strategies=(S.LFU, S.TIMESTAMP)) -> BatchedDynamicEmbeddingTables:
    options = [
        DynamicEmbTableOptions(dim=4, max_capacity=256, score_strategy=strategies[0]),
        DynamicEmbTableOptions(dim=2, max_capacity=256, score_strategy=strategies[1]),
    ]
    return BatchedDynamicEmbeddingTables(
        options, [0, 1], optimizer=EmbOptimType.ADAM, table_names=["items", "clock"]
    )


def _rows(dim: int, seed: int, scores) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {
        k: (torch.randn(dim, generator=g).tolist(), torch.rand(2 * dim, generator=g).tolist(), s)
        for k, s in zip(KEYS, scores)
    }


def _write_checkpoint(path, world_size=2) -> tuple[dict, dict]:
    items = _rows(4, 1, [[5], [1], [7], [2], [9], [4]])
    clock = _rows(2, 2, [[1000], [5_000_000], [0], [3], [10**9], [77]])
    write_table(path / "model", "items", items, world_size,
                {**ADAM_ARGS, "evict_strategy": "EvictStrategy.KLfu", "step_score": 0})  # fmt: skip
    write_table(path / "model", "clock", clock, world_size,
                {**ADAM_ARGS, "evict_strategy": "EvictStrategy.KLru", "step_score": 0})  # fmt: skip
    return items, clock


def _contents(model) -> list:
    out = []
    for table in model.tables:
        keys, rows, scores, _ = table.export_batch(0, table.capacity(), include_extra=True)
        order = torch.argsort(keys)
        out.append((keys[order], rows[order], scores[order]))
    return out


def test_hand_written_dynamicemb_checkpoint_loads_exactly(tmp_path):
    items, clock = _write_checkpoint(tmp_path)
    model = _model()
    before = time.monotonic_ns()
    DynamicEmbLoad(tmp_path, model, optim=True)
    after = time.monotonic_ns()
    keys = torch.tensor(KEYS)
    for table, saved in ((model.tables[0], items), (model.tables[1], clock)):
        got, rows, _, _ = table.export_batch(0, table.capacity(), include_extra=True)
        assert sorted(got.tolist()) == sorted(KEYS)
        for k, row in zip(got.tolist(), rows.tolist()):
            assert row == saved[k][0] + saved[k][1]  # embedding then Adam's m, v: exact
    assert model.tables[0].get_scores(keys).tolist() == [items[k][2][0] for k in KEYS]
    ages = torch.tensor([clock[k][2][0] for k in KEYS])
    stamps = model.tables[1].get_scores(keys)
    assert ((stamps >= before - ages) & (stamps <= after - ages)).all()
    assert model.step == 17  # Adam's iterations
    config = model.optimizer_config
    assert (config.learning_rate, config.beta1, config.beta2, config.eps) == (0.02, 0.8, 0.99, 1e-6)


def test_dump_in_dynamicemb_layout_round_trips(tmp_path):
    src = _model((S.LFU, (S.LFU, S.TIMESTAMP)))
    g = torch.Generator().manual_seed(5)
    keys = torch.tensor(KEYS)
    for table in src.tables:
        values = torch.randn(len(KEYS), table.dim, generator=g)
        state = torch.rand(len(KEYS), 2 * table.dim, generator=g)
        stamps = torch.full((len(KEYS),), time.monotonic_ns()) - torch.arange(len(KEYS)) * 1000
        table.restore(keys, values, state, torch.arange(len(KEYS)) + 3,
                      stamps if table.keeps_timestamps else None)  # fmt: skip
    src.step = 9
    DynamicEmbDump(tmp_path, src, optim=True, format="dynamicemb")
    # The files are DynamicEmb's, read back by the hand-written reader.
    args = json.loads((tmp_path / "model" / "items_opt_args.json").read_text())
    assert args["opt_type"] == "adam" and args["iters"] == 9
    assert args["evict_strategy"] == "EvictStrategy.KLfu" and args["dist_type"] == "roundrobin"
    saved = read_table(tmp_path / "model", "clock", 2, 4, 2, "roundrobin")
    assert sorted(saved) == sorted(KEYS)
    assert [saved[k][2][0] for k in KEYS] == list(range(3, 3 + len(KEYS)))  # LFU first
    assert all(saved[k][2][1] >= 1000 * i for i, k in enumerate(KEYS))  # then the age
    dst = _model((S.LFU, (S.LFU, S.TIMESTAMP)))
    DynamicEmbLoad(tmp_path, dst, optim=True)
    for (k1, r1, s1), (k2, r2, s2) in zip(_contents(src), _contents(dst)):
        assert torch.equal(k1, k2) and torch.equal(r1, r2) and torch.equal(s1, s2)
    assert dst.step == 9
    back, there = src.tables[1].get_timestamps(keys), dst.tables[1].get_timestamps(keys)
    assert ((there - back).abs() < 10**9).all()  # ages re-anchored on the load's clock


def test_dump_refuses_an_unknown_format(tmp_path):
    with pytest.raises(ValueError, match="`format` must be one of"):
        DynamicEmbDump(tmp_path, _model(), format="hkv")


def _truncate(path, name, nbytes=4):
    file = path / "model" / name
    file.write_bytes(file.read_bytes()[:-nbytes])
    return file.name


def _extend(path, name):
    file = path / "model" / name
    file.write_bytes(file.read_bytes() + b"\0" * 8)
    return file.name


def _remove(path, name):
    (path / "model" / name).unlink()
    return name


def _rewrite_json(path, name, **changes):
    file = path / "model" / name
    file.write_text(json.dumps({**json.loads(file.read_text()), **changes}))
    return name


BAD_FILES = {
    "truncated values": lambda p: _truncate(p, "clock_emb_values.rank_1.world_size_2"),
    "extended scores": lambda p: _extend(p, "clock_emb_scores.rank_0.world_size_2"),
    "keys not int64": lambda p: _truncate(p, "clock_emb_keys.rank_0.world_size_2", 3),
    "missing rank": lambda p: _remove(p, "clock_emb_keys.rank_1.world_size_2"),
    "truncated optimizer state": lambda p: _truncate(p, "clock_emb_opt_values.rank_0.world_size_2"),
    "evict strategy": lambda p: _rewrite_json(p, "clock_opt_args.json", evict_strategy="EvictStrategy.KLfu"),
    "opt type": lambda p: _rewrite_json(p, "clock_opt_args.json", opt_type="sgd"),
    "bad json": lambda p: (p / "model" / "clock_opt_args.json").write_text("{") and "clock_opt_args.json",
}  # fmt: skip


@pytest.mark.parametrize("damage", sorted(BAD_FILES))
def test_a_bad_file_is_named_and_no_table_changes(tmp_path, damage):
    _write_checkpoint(tmp_path)
    name = BAD_FILES[damage](tmp_path)
    model = _model()
    model.tables[0].find_or_insert(torch.tensor([1, 2, 3]))  # a table that must not change
    before = _contents(model)
    with pytest.raises(CheckpointError, match=name.replace(".", r"\.")):
        DynamicEmbLoad(tmp_path, model, optim=True)
    for (k1, r1, s1), (k2, r2, s2) in zip(before, _contents(model)):
        assert torch.equal(k1, k2) and torch.equal(r1, r2) and torch.equal(s1, s2)


def test_a_saved_table_the_model_lacks_is_an_error(tmp_path):
    _write_checkpoint(tmp_path)
    write_table(tmp_path / "model", "other", _rows(4, 3, [[1]] * len(KEYS)), 2,
                {**ADAM_ARGS, "evict_strategy": "EvictStrategy.KLru"})  # fmt: skip
    with pytest.raises(CheckpointError, match="'other'"):
        DynamicEmbLoad(tmp_path, _model())
