"""Lookups go on while deltas are applied, and each sees one whole version: never a
half-applied delta (apply_delta builds the new tables aside and swaps them in)."""

import threading

import torch

from dynemb import BatchedDynamicEmbeddingTables, DynamicEmbPoolingMode, DynamicEmbTableOptions
from dynemb.deltas import DeltaPublisher, delta_path
from dynemb.inference.exportable_tables import InferenceEmbeddingCollection

OPTIONS = [
    DynamicEmbTableOptions(dim=4, max_capacity=256, bucket_capacity=16, seed=s) for s in (1, 2)
]
KEYS = torch.arange(-20, 120)
VERSIONS = 8


def _serving(publisher) -> InferenceEmbeddingCollection:
    serving = InferenceEmbeddingCollection(
        OPTIONS, table_names=["a", "b"], feature_table_map=[0, 1]
    )
    serving.load_from_dynamicemb_file(publisher.base_path)
    return serving


def _lookup(serving) -> torch.Tensor:
    both = torch.cat([KEYS, KEYS])  # every key in both tables: a half-applied delta shows
    return serving(both, torch.arange(both.numel() + 1))


def test_lookups_during_apply_delta_see_whole_versions(tmp_path):
    model = BatchedDynamicEmbeddingTables(
        OPTIONS, [0, 1], pooling_mode=DynamicEmbPoolingMode.NONE, table_names=["a", "b"],
        learning_rate=0.5,
    )  # fmt: skip
    publisher = DeltaPublisher(model, tmp_path)
    publisher.publish_base()
    for v in range(VERSIONS):
        keys = torch.arange(10 * v, 10 * v + 40)
        model(torch.cat([keys, keys]), torch.arange(81)).sum().backward()
        model.tables[v % 2].erase(torch.tensor([10 * v + 1]))
        publisher.publish()
    reference = _serving(publisher)
    states = [_lookup(reference)]
    for v in range(1, VERSIONS + 1):
        reference.apply_delta(delta_path(tmp_path, v))
        states.append(_lookup(reference))
    assert all(not torch.equal(a, b) for a, b in zip(states, states[1:]))

    serving = _serving(publisher)
    seen, done = [], threading.Event()

    def reader():
        while not done.is_set():
            seen.append(_lookup(serving))

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for v in range(1, VERSIONS + 1):
            serving.apply_delta(delta_path(tmp_path, v))
    finally:
        done.set()
        thread.join()
    seen.append(_lookup(serving))
    assert torch.equal(seen[-1], states[-1])
    versions = [next(i for i, s in enumerate(states) if torch.equal(out, s)) for out in seen]
    assert versions == sorted(versions)  # each a whole version, never going back
