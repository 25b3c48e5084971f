"""A small TorchRec model on static tables (an EmbeddingBagCollection), its batches, and
its dynamic twin: a BatchedDynamicEmbeddingTables whose tables warm-start from it."""

import torch
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, PoolingType
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from dynemb import BatchedDynamicEmbeddingTables, DynamicEmbPoolingMode, DynamicEmbTableOptions
from dynemb.optimizer import EmbOptimType
from dynemb.warm_start import WarmStart

TABLES = {"t0": (50, 8), "t1": (30, 4)}  # name -> (rows, dim); feature f<i> reads t<i>
BATCH, LR = 6, 0.05


def static_model(
    seed: int = 0, pooling: str = "SUM", weighted: bool = False
) -> EmbeddingBagCollection:
    """TABLES as a TorchRec EBC pooling by ``pooling`` (SUM / MEAN); ``weighted``: its
    features carry per-sample weights."""
    torch.manual_seed(seed)
    configs = [
        EmbeddingBagConfig(name=name, embedding_dim=dim, num_embeddings=rows,
                           feature_names=[f"f{i}"], pooling=PoolingType[pooling])
        for i, (name, (rows, dim)) in enumerate(TABLES.items())
    ]  # fmt: skip
    return EmbeddingBagCollection(tables=configs, is_weighted=weighted)


def batch(g: torch.Generator, high: dict | None = None, weighted: bool = False) -> tuple:
    """``(kjt, indices, offsets)`` of one batch (ids below each table's rows, or
    ``high[name]``), with repeats and an empty bag; ``weighted``: the kjt carries
    per-sample weights in [-1, 2) (``kjt.weights()``)."""
    lengths = torch.randint(0, 4, (len(TABLES) * BATCH,), generator=g)
    lengths[1] = 0
    parts = []
    for i, (name, (rows, _)) in enumerate(TABLES.items()):
        n = int(lengths[i * BATCH : (i + 1) * BATCH].sum())
        parts.append(torch.randint(0, (high or {}).get(name, rows), (n,), generator=g))
    values = torch.cat(parts)
    weights = torch.rand(values.shape, generator=g) * 3 - 1 if weighted else None
    kjt = KeyedJaggedTensor(keys=[f"f{i}" for i in range(len(TABLES))], values=values,
                            lengths=lengths, weights=weights)  # fmt: skip
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
    return kjt, values, offsets


def train_static(
    model: EmbeddingBagCollection, steps: int, g: torch.Generator, weighted: bool = False
) -> None:
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    for _ in range(steps):
        kjt, _, _ = batch(g, weighted=weighted)
        out = model(kjt).values()
        optimizer.zero_grad()
        out.backward(torch.randn(out.shape, generator=g))
        optimizer.step()


def dynamic_twin(
    sources: dict, device="cpu", optimizer=EmbOptimType.EXACT_SGD, pooling="SUM", **options
) -> BatchedDynamicEmbeddingTables:
    """Dynamic tables of TABLES' dims pooling by ``pooling``, table ``name`` warm-started
    from ``sources[name]`` (``options``: more DynamicEmbTableOptions fields of every
    table)."""
    return BatchedDynamicEmbeddingTables(
        [
            DynamicEmbTableOptions(
                dim=dim,
                max_capacity=256,
                bucket_capacity=16,
                warm_start=sources.get(name),
                **options,
            )
            for name, (_, dim) in TABLES.items()
        ],  # fmt: skip
        feature_table_map=list(range(len(TABLES))),
        pooling_mode=DynamicEmbPoolingMode[pooling],
        optimizer=optimizer,
        learning_rate=LR,
        table_names=list(TABLES),
        device=device,
    )


def state_dict_sources(model: EmbeddingBagCollection) -> dict:
    state = model.state_dict()
    return {name: WarmStart.from_state_dict(state, name) for name in TABLES}
