"""Rank-side code of tests/shard/test_mixed_sharding.py: one model holding a dynamic table
under each sharding type (table-wise, column-wise, row-wise and, pooled, table-row-wise
on the last node of LOCAL ranks) beside an ordinary TorchRec table, pooled (EmbeddingBagCollection, SUM / MEAN) or sequence (EmbeddingCollection),
and its unsharded reference: each table trained alone in a BatchedDynamicEmbeddingTables
on the global batch (a column-wise table as one table per slice, its columns and
column offset: TorchRec keeps optimizer state per column shard)."""

import dataclasses
import os

import torch
from torchrec import (
    EmbeddingBagCollection,
    EmbeddingBagConfig,
    EmbeddingCollection,
    EmbeddingConfig,
    KeyedJaggedTensor,
)
from torchrec.distributed.comm_ops import get_gradient_division
from torchrec.distributed.sharding_plan import (
    column_wise,
    construct_module_sharding_plan,
    row_wise,
    table_row_wise,
    table_wise,
)
from torchrec.modules.embedding_configs import PoolingType

from dynemb import (
    BatchedDynamicEmbeddingTables,
    DynamicEmbDump,
    DynamicEmbPoolingMode,
    DynamicEmbScoreStrategy,
)
from dynemb.optimizer import EmbOptimType
from dynemb.shard import DynamicEmbeddingBagCollectionSharder, DynamicEmbeddingCollectionSharder
from tests.support.plan_entries import dynamic_entry, sharded_model
from tests.support.sharded_workers import dynamic_tables, table_options

DIM = 8  # every table's (an EmbeddingCollection's tables share one dim)
ROWS = 40  # num_embeddings (nominal for the dynamic tables)
SMALL = 16  # capacity of the table-wise and column-wise tables: they evict
LARGE = 256
TYPES = {"tw": "table_wise", "cw": "column_wise", "rw": "row_wise", "twrw": "table_row_wise"}
LOCAL = 2  # ranks a node (TorchRec's local size): 4 ranks are 2 nodes
ORDINARY = "ord"  # an ordinary TorchRec table (table-wise on rank 0, fbgemm's kernel)
BATCH = 4  # samples per rank
STEPS = 10
LR = 0.05
# fbgemm's CPU kernel (the ordinary table's) has no Adam: those cases leave it out.
ORDINARY_OPTIMIZERS = ("EXACT_SGD", "EXACT_ROWWISE_ADAGRAD")


@dataclasses.dataclass(frozen=True)
class Case:
    optimizer: str
    pooling: str  # SUM / MEAN (EmbeddingBagCollection) or NONE (EmbeddingCollection)

    def tables(self) -> list[str]:
        # TorchRec has no table-row-wise sharding of sequence (EmbeddingCollection) tables.
        names = [n for n in TYPES if n != "twrw" or self.pooling != "NONE"]
        return [*names, ORDINARY] if self.optimizer in ORDINARY_OPTIMIZERS else names

    def features(self) -> list[str]:
        return [f"f_{name}" for name in self.tables()]

    def fused_params(self) -> dict:
        return {"optimizer": EmbOptimType[self.optimizer], "learning_rate": LR, "eps": 1e-3}


def dynamic_options(name: str):
    options = table_options(DIM, "hash_roundrobin", SMALL if name in ("tw", "cw") else LARGE)
    options.bucket_capacity = SMALL
    options.score_strategy = DynamicEmbScoreStrategy.STEP  # scores comparable across runs
    return options


def ordinary_rows() -> torch.Tensor:
    return torch.rand(ROWS, DIM, generator=torch.Generator().manual_seed(11)) - 0.5


def _init(weight: torch.Tensor) -> torch.Tensor:
    if weight.numel() == 0:  # a rank without the table
        return weight
    with torch.no_grad():
        return weight.copy_(ordinary_rows())


def _module(case: Case):
    kinds = (EmbeddingConfig, EmbeddingCollection)
    if case.pooling != "NONE":
        kinds = (EmbeddingBagConfig, EmbeddingBagCollection)
    configs = []
    for name, feature in zip(case.tables(), case.features(), strict=True):
        args = dict(name=name, embedding_dim=DIM, num_embeddings=ROWS, feature_names=[feature])
        if name == ORDINARY:
            args["init_fn"] = _init
        if case.pooling != "NONE":
            args["pooling"] = PoolingType[case.pooling]
        configs.append(kinds[0](**args))
    return kinds[1](tables=configs, device=torch.device("meta"))


def build_model(case: Case, world_size: int):
    module = _module(case)
    kind = DynamicEmbeddingBagCollectionSharder
    if case.pooling == "NONE":
        kind = DynamicEmbeddingCollectionSharder
    sharder = kind(fused_params=case.fused_params())
    local_size = min(LOCAL, world_size)
    per_param = {
        "tw": table_wise(rank=world_size - 1, compute_kernel="customized_kernel"),
        # size_per_rank: column_wise(ranks=...) gives slices of at least 4 columns
        "cw": column_wise(
            size_per_rank=[DIM // world_size] * world_size, compute_kernel="customized_kernel"
        ),
        "rw": row_wise(compute_kernel="customized_kernel"),
        "twrw": table_row_wise(host_index=world_size // local_size - 1),
    }
    per_param = {name: per_param[name] for name in case.tables() if name in per_param}
    if ORDINARY in case.tables():
        per_param[ORDINARY] = table_wise(rank=0, compute_kernel="fused")
    mplan = construct_module_sharding_plan(
        module, per_param_sharding=per_param, local_size=local_size, world_size=world_size,
        device_type="cpu", sharder=sharder,
    )  # fmt: skip
    for name in (n for n in TYPES if n in per_param):
        # table_row_wise() names no compute kernel
        mplan[name] = dynamic_entry(
            mplan[name], dynamic_options(name), compute_kernel="customized_kernel"
        )
    return sharded_model(module, mplan, sharder)


def global_batch(step: int, batch_size: int, case: Case):
    """Feature-major lengths (features, batch) and keys, the same on every rank: raw ids
    far beyond num_embeddings for the dynamic tables, rows for the ordinary one."""
    g = torch.Generator().manual_seed(900 + step)
    tables = case.tables()
    lengths = torch.randint(0, 3, (len(tables), batch_size), generator=g)
    parts = []
    for f, name in enumerate(tables):
        ids = torch.randint(0, ROWS, (int(lengths[f].sum()),), generator=g)
        parts.append(ids if name == ORDINARY else ids * (1 << 40) - 3)
    return lengths, parts


def feature_grad(step: int, f: int, rows: int) -> torch.Tensor:
    """The loss's gradient of feature f's global output (rows: samples or ids)."""
    return torch.randn(rows, DIM, generator=torch.Generator().manual_seed(70 + 10 * step + f))


def _local_rows(case: Case, lengths: torch.Tensor, f: int, start: int, stop: int) -> slice:
    """Feature f's rows of the global output that belong to samples [start, stop)."""
    if case.pooling != "NONE":
        return slice(start, stop)
    return slice(int(lengths[f, :start].sum()), int(lengths[f, :stop].sum()))


def _entries(table) -> dict[str, torch.Tensor]:
    keys, values, scores, _ = table.export_batch(0, max(1, table.capacity()), include_extra=True)
    order = torch.argsort(keys)
    return {"keys": keys[order], "values": values[order], "scores": scores[order]}


def train_mixed(rank: int, world_size: int, cases: list[Case], refused_dir: str):
    """Per case: this rank's outputs (per step, per feature), its dynamic tables'
    entries, the ordinary table's rows on the rank holding it (else None), and the
    error of a dump of the model in DynamicEmb's layout into ``refused_dir``."""
    results = []
    start, stop = rank * BATCH, (rank + 1) * BATCH
    os.environ["LOCAL_WORLD_SIZE"] = str(min(LOCAL, world_size))  # TorchRec's node size
    for case in cases:
        model = build_model(case, world_size)
        outputs = []
        for step in range(STEPS):
            lengths, parts = global_batch(step, BATCH * world_size, case)
            mine = [
                p[int(lengths[f, :start].sum()) : int(lengths[f, :stop].sum())]
                for f, p in enumerate(parts)
            ]
            kjt = KeyedJaggedTensor(
                keys=case.features(),
                values=torch.cat(mine),
                lengths=lengths[:, start:stop].flatten(),
            )
            out = model(kjt)
            got = [out[f] if case.pooling != "NONE" else out[f].values() for f in case.features()]
            loss = 0
            for f, value in enumerate(got):
                rows = len(parts[f]) if case.pooling == "NONE" else BATCH * world_size
                grad = feature_grad(step, f, rows)[_local_rows(case, lengths, f, start, stop)]
                loss = loss + (value * grad).sum()
            loss.backward()
            outputs.append([v.detach().clone() for v in got])
        tables = {name: _entries(t) for name, t in dynamic_tables(model).items()}
        ordinary = None
        if ORDINARY in case.tables():
            prefix = "embeddings" if case.pooling == "NONE" else "embedding_bags"
            shards = model.state_dict()[f"{prefix}.{ORDINARY}.weight"].local_shards()
            ordinary = shards[0].tensor.clone() if shards else None
        try:
            DynamicEmbDump(refused_dir, model, format="dynamicemb")
            refused = None
        except ValueError as e:
            refused = str(e)
        results.append((outputs, tables, ordinary, refused))
    return results


def _reference_table(case: Case, options, name: str) -> BatchedDynamicEmbeddingTables:
    return BatchedDynamicEmbeddingTables(
        [options],
        [0],
        pooling_mode=DynamicEmbPoolingMode[case.pooling],
        optimizer=EmbOptimType[case.optimizer],
        learning_rate=LR,
        eps=1e-3,
        table_names=[name],
    )


def train_reference(case: Case, world_size: int):
    """The unsharded run on the global batch. Returns ``(tables, outputs)``: name ->
    BatchedDynamicEmbeddingTables (``cw0``, ``cw1``, ... the column slices), and per
    step the global output of each feature (a column-wise feature's slices joined)."""
    width = DIM // world_size
    tables = {}
    for name in case.tables():
        if name == "cw":
            for r in range(world_size):
                options = dataclasses.replace(
                    dynamic_options("cw"), dim=width, column_offset=r * width
                )
                tables[f"cw{r}"] = _reference_table(case, options, f"cw{r}")
        else:
            tables[name] = _reference_table(case, dynamic_options(name), name)
    if ORDINARY in tables:
        tables[ORDINARY].tables[0].insert_or_assign(torch.arange(ROWS), ordinary_rows())
    # TorchRec divides the embedding gradient by the world size in its collectives.
    scale = 1.0 / world_size if get_gradient_division() else 1.0
    batch = BATCH * world_size
    outputs = []
    for step in range(STEPS):
        lengths, parts = global_batch(step, batch, case)
        step_out = []
        for f, name in enumerate(case.tables()):
            offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths[f].cumsum(0)])
            rows = len(parts[f]) if case.pooling == "NONE" else batch
            grad = feature_grad(step, f, rows) * scale
            slices = [f"cw{r}" for r in range(world_size)] if name == "cw" else [name]
            columns = []
            for s, table in enumerate(slices):
                out = tables[table](parts[f], offsets)
                cols = slice(s * out.shape[1], (s + 1) * out.shape[1])
                (out * grad[:, cols]).sum().backward()
                columns.append(out.detach())
            step_out.append(torch.cat(columns, dim=1))
        outputs.append(step_out)
    return tables, outputs
