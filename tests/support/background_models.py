"""The models, training steps and checks that the background-publication tests
(test_delta_background*.py) share."""

import copy

import torch

from dynemb import (
    BatchedDynamicEmbeddingTables,
    DynamicEmbPoolingMode,
    DynamicEmbScoreStrategy,
    DynamicEmbTableOptions,
)
from dynemb.deltas import DeltaPublisher, delta_path, read_delta
from dynemb.inference.exportable_tables import InferenceEmbeddingCollection
from dynemb.optimizer import EmbOptimType
from dynemb.table.rw_lock import RWLock

DIM = 4
SPACE = torch.arange(-100, 100)  # every key trained
NAMES = ["a", "b"]
STRATEGIES = {
    "lfu_step": (DynamicEmbScoreStrategy.LFU, DynamicEmbScoreStrategy.STEP),
    "timestamp_lfu": ((DynamicEmbScoreStrategy.TIMESTAMP, DynamicEmbScoreStrategy.LFU),) * 2,
}


def table_options(strategies=STRATEGIES["lfu_step"]) -> list[DynamicEmbTableOptions]:
    out = []
    for i, strategy in enumerate(strategies):
        o = DynamicEmbTableOptions(
            dim=DIM, max_capacity=32, bucket_capacity=16, score_strategy=strategy, seed=3 + i
        )
        o.eval_initializer_args.value = 0.5 + i
        out.append(o)
    return out


def model_of(options) -> BatchedDynamicEmbeddingTables:
    return BatchedDynamicEmbeddingTables(
        options, [0, 1], pooling_mode=DynamicEmbPoolingMode.NONE,
        optimizer=EmbOptimType.ADAM, learning_rate=0.1, table_names=NAMES,
    )  # fmt: skip


def train_step(model, step: int, seen: list | None = None) -> None:
    """One step on 2 features x 16 keys from ~200 keys (tables of 32 rows: evictions)."""
    keys = torch.randint(-100, 100, (32,), generator=torch.Generator().manual_seed(step))
    if seen is not None:
        seen.append(keys)
    model(keys, torch.arange(keys.numel() + 1)).sum().backward()


def twin_of(model, publisher, directory) -> DeltaPublisher:
    """A deep copy of ``model`` now (a batch boundary) with a publisher of its own that
    stands where ``publisher`` stands (same version and base, the same keys logged)."""
    logs = [t.change_log for t in model.tables]
    # The logs are not copied (the twin's publisher attaches its own); a lock cannot
    # be: the twin gets fresh ones.
    memo = {id(log): None for log in logs}
    memo.update({id(t.lock): RWLock() for t in model.tables})
    twin = copy.deepcopy(model, memo=memo)
    twin_publisher = DeltaPublisher(twin, directory, optim=publisher.optim)
    for log, twin_table in zip(logs, twin.tables, strict=True):
        touched, removed = log.take()
        log.touched(touched)  # the original's log is left as it was
        log.removed(removed)
        twin_table.change_log.touched(touched)
        twin_table.change_log.removed(removed)
    twin_publisher.version = publisher.version
    twin_publisher.base_dump_id = publisher.base_dump_id
    return twin_publisher


def assert_same_delta(got_path, expected_path) -> None:
    got, expected = read_delta(got_path), read_delta(expected_path)
    assert got.version == expected.version and got.base_dump_id == expected.base_dump_id
    assert got.tables.keys() == expected.tables.keys()
    for name, e in expected.tables.items():
        g = got.tables[name]
        for field in ("keys", "values", "scores", "state", "timestamps", "tombstones"):
            a, b = getattr(g, field), getattr(e, field)
            assert (a is None) == (b is None), (name, field)
            if a is not None:
                assert a.dtype == b.dtype and torch.equal(a, b), (name, field)


def replay(options, publisher) -> InferenceEmbeddingCollection:
    serving = InferenceEmbeddingCollection(options, table_names=NAMES, feature_table_map=[0, 1])
    serving.load_from_dynamicemb_file(publisher.base_path)
    for version in range(1, publisher.version + 1):
        assert serving.apply_delta(delta_path(publisher.directory, version)) == version
    return serving


def started(tmp_path, gate=None, **kwargs) -> tuple:
    """``(options, model, publisher, seen)``: a model trained one step, its publisher
    (``kwargs``) at version 0 (``gate``: the writer's gate, opened for the base only)."""
    options = table_options()
    model = model_of(options)
    publisher = DeltaPublisher(model, tmp_path, **kwargs)
    seen = []
    train_step(model, 1, seen)
    if gate is not None:
        gate.set()
    publisher.publish_base()
    if gate is not None:
        gate.clear()
    return options, model, publisher, seen


def assert_serving_follows(model, serving, seen) -> None:
    every = torch.unique(torch.cat(seen))
    both = torch.cat([every, every])
    offsets = torch.arange(both.numel() + 1)
    model.eval()
    with torch.no_grad():
        expected = model(both, offsets)
    model.train()
    assert torch.equal(serving(both, offsets), expected)
    assert serving.sizes == [t.size() for t in model.tables]


def assert_delta_is_the_state_now(model, path) -> None:
    """The delta at ``path`` holds each of its keys' entry in ``model`` now (row with
    optimizer state when published, score, timestamp) and tombstones of keys it lacks."""
    delta = read_delta(path)
    for name, table in zip(NAMES, model.tables, strict=True):
        d = delta.tables[name]
        rows, scores, found = table.find_entries(d.keys)
        assert bool(found.all()), name
        assert torch.equal(d.values, rows[:, :DIM]), name
        if d.state is not None:
            assert torch.equal(d.state, rows[:, DIM:]), name
        assert torch.equal(d.scores, scores), name
        if d.timestamps is not None:
            assert torch.equal(d.timestamps, table.get_timestamps(d.keys)), name
        assert not bool(table.contains(d.tombstones).any()), name
        both = torch.cat([d.keys, d.tombstones])
        assert both.unique().numel() == both.numel(), name  # one entry per key
