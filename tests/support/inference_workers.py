"""Rank-side code of tests/inference/test_inference_export.py: train a sharded EBC and EC, look a
held-out batch up in eval mode, build inference modules from the trained model and dump it."""

import torch

from dynemb.checkpoint import DynamicEmbDump
from dynemb.inference.exportable_tables import (
    InferenceEmbeddingBagCollection,
    InferenceEmbeddingCollection,
)
from tests.support.sharded_workers import (
    FEATURE_TABLE,
    Case,
    build_model,
    dims,
    global_batch,
    local_kjt,
)

TRAIN_STEPS = 4
EVAL_STEP = 99  # a batch never trained on: some keys are missing (eval initializer rows)


def inference_module(case: Case):
    """The inference counterpart of ``build_model(case)``: same tables, features, options."""
    from tests.support.sharded_workers import table_options

    options = [table_options(d, case.dist_type, 256) for d in dims(case)]
    if case.pooling == "NONE":
        return InferenceEmbeddingCollection(
            options, table_names=["t0", "t1"], feature_table_map=FEATURE_TABLE
        )
    pooling = {"SUM": 1, "MEAN": 2}[case.pooling]
    return InferenceEmbeddingBagCollection(
        options, pooling_mode=pooling, table_names=["t0", "t1"], feature_table_map=FEATURE_TABLE
    )


def _values(case: Case, out, kjt) -> torch.Tensor:
    """An EBC's pooled (B, sum dims), or an EC's rows (n, dim) feature-major."""
    if case.pooling != "NONE":
        return out.values()
    return torch.cat([out[f].values() for f in kjt.keys()])


def _train(model, case: Case, rank: int, batch_sizes: list[int]) -> None:
    start = sum(batch_sizes[:rank])
    stop, total = start + batch_sizes[rank], sum(batch_sizes)
    for step in range(TRAIN_STEPS):
        lengths, keys, weights = global_batch(step, total, case.weighted)
        kjt = local_kjt(lengths, keys, weights, start, stop)
        values = _values(case, model(kjt), kjt)
        grad = torch.randn(values.shape, generator=torch.Generator().manual_seed(7 + step))
        (values * grad).sum().backward()


def eval_batch(case: Case, rank: int, batch_sizes: list[int]):
    """This rank's samples of the held-out batch: the KJT."""
    start = sum(batch_sizes[:rank])
    lengths, keys, weights = global_batch(EVAL_STEP, sum(batch_sizes), case.weighted)
    return local_kjt(lengths, keys, weights, start, start + batch_sizes[rank])


def train_and_build(rank, world_size, cases: list[Case], batch_sizes: list[int], root: str | None):
    """Per case: (the model's eval output, the inference module's output for the same
    local batch, its keys, offsets and weights, and the module's rows per table); dumps each model
    to ``root/<case index>`` (dynemb's format) and ``root/<index>_dynamicemb``."""
    results = []
    for i, case in enumerate(cases):
        model = build_model(case, world_size)
        _train(model, case, rank, batch_sizes)
        model.eval()
        kjt = eval_batch(case, rank, batch_sizes)
        with torch.no_grad():
            expected = _values(case, model(kjt), kjt)
        inference = inference_module(case)
        inference.load_from_model(model)
        got = inference(kjt.values(), kjt.offsets(), per_sample_weights=kjt.weights_or_none())
        if root is not None:
            DynamicEmbDump(f"{root}/{i}", model)
            DynamicEmbDump(f"{root}/{i}_dynamicemb", model, format="dynamicemb")
        results.append(
            (
                expected,
                got,
                kjt.values(),
                kjt.offsets(),
                kjt.weights_or_none(),
                list(inference.sizes),
            )
        )
    return results
