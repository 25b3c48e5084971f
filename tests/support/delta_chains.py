"""A delta chain of one table ``t`` for the tests that tamper with deltas
(test_delta_refusals.py, attack/test_forged_deltas.py): a base after a step over keys
0..9, then one delta per step."""

import torch

from dynemb import BatchedDynamicEmbeddingTables, DynamicEmbPoolingMode, DynamicEmbTableOptions
from dynemb.deltas import DeltaPublisher
from dynemb.inference.exportable_tables import InferenceEmbeddingCollection

OPTIONS = [DynamicEmbTableOptions(dim=4, max_capacity=64, bucket_capacity=16)]


def step(model, keys: torch.Tensor) -> None:
    """A training step of ``model`` over ``keys``, one key per bag."""
    model(keys, torch.arange(keys.numel() + 1)).sum().backward()


def one_table_chain(directory, steps: list[tuple[torch.Tensor, int]]) -> DeltaPublisher:
    """The base, then a delta per ``(keys, erased)`` of ``steps``: a step over ``keys``,
    then key ``erased`` erased."""
    model = BatchedDynamicEmbeddingTables(
        OPTIONS, [0], pooling_mode=DynamicEmbPoolingMode.NONE, table_names=["t"]
    )
    publisher = DeltaPublisher(model, directory)
    step(model, torch.arange(10))
    publisher.publish_base()
    for keys, erased in steps:
        step(model, keys)
        model.tables[0].erase(torch.tensor([erased]))
        publisher.publish()
    return publisher


def serving_base(publisher: DeltaPublisher) -> InferenceEmbeddingCollection:
    """A serving module holding ``publisher``'s base."""
    serving = InferenceEmbeddingCollection(OPTIONS, table_names=["t"])
    serving.load_from_dynamicemb_file(publisher.base_path)
    return serving


def lookup(serving: InferenceEmbeddingCollection, keys: torch.Tensor) -> torch.Tensor:
    """``serving``'s rows of ``keys``, one key per bag."""
    return serving(keys, torch.arange(keys.numel() + 1))
