"""Rank-side code of tests/shard/test_column_wise.py: a dynamic table sharded column-wise over
2 ranks beside a row-wise one, compared with one unsharded BatchedDynamicEmbeddingTables
holding each slice as a table of its own (the slices' meaning: same keys, own columns
and optimizer state) and with the whole table unsharded at full width."""

import dataclasses
import warnings

import torch
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig
from torchrec.distributed.comm_ops import get_gradient_division
from torchrec.distributed.sharding_plan import (
    column_wise,
    construct_module_sharding_plan,
    row_wise,
)
from torchrec.modules.embedding_configs import PoolingType

from dynemb import BatchedDynamicEmbeddingTables, DynamicEmbCheckMode, DynamicEmbPoolingMode
from dynemb.optimizer import optimizer_type_of
from dynemb.shard import DynamicEmbeddingBagCollectionSharder
from tests.support import checkpoint_plans_workers as plans
from tests.support.ftrl_reference import optimizer_kwargs
from tests.support.plan_entries import dynamic_entry, sharded_model
from tests.support.sharded_workers import dynamic_tables
from tests.support.table_wise_workers import (
    BATCH,
    LR,
    ROWS,
    STEPS,
    dynamic_options,
    entries,
    global_batch,
    local_kjt,
    out_grad,
)

CW_DIM, RW_DIM = 8, 4
FEATURES = ["f0", "f1"]


@dataclasses.dataclass(frozen=True)
class Case:
    optimizer: str
    pooling: str  # SUM / MEAN

    def fused_params(self) -> dict:
        return {
            "optimizer": optimizer_type_of(self.optimizer), "learning_rate": LR, "eps": 1e-3,
            **optimizer_kwargs(self.optimizer),
        }  # fmt: skip


def _options(name: str, dim: int, **fields):
    options = dynamic_options("tw" if name == "cw" else "rw", "table_wise")  # cw: evicting
    return dataclasses.replace(options, dim=dim, **fields)


def build_model(case: Case, world_size: int, per_param=None, **fields):
    """The sharded model; ``fields``: more DynamicEmbTableOptions of both tables;
    ``per_param``: other sharding generators for "cw" and "rw" (default: column-wise and
    row-wise)."""
    pooling = PoolingType[case.pooling]
    configs = [
        EmbeddingBagConfig(name="cw", embedding_dim=CW_DIM, num_embeddings=ROWS,
                           feature_names=["f0"], pooling=pooling),
        EmbeddingBagConfig(name="rw", embedding_dim=RW_DIM, num_embeddings=ROWS,
                           feature_names=["f1"], pooling=pooling),
    ]  # fmt: skip
    module = EmbeddingBagCollection(tables=configs, device=torch.device("meta"))
    sharder = DynamicEmbeddingBagCollectionSharder(fused_params=case.fused_params())
    per_param = per_param or {
        "cw": column_wise(ranks=list(range(world_size)), compute_kernel="customized_kernel"),
        "rw": row_wise(compute_kernel="customized_kernel"),
    }
    mplan = construct_module_sharding_plan(
        module, per_param_sharding=per_param, local_size=world_size, world_size=world_size,
        device_type="cpu", sharder=sharder,
    )  # fmt: skip
    for name, dim in (("cw", CW_DIM), ("rw", RW_DIM)):
        mplan[name] = dynamic_entry(
            mplan[name], _options(name, dim, **fields), compute_kernel="customized_kernel"
        )
    return sharded_model(module, mplan, sharder)


def lose_a_key_sequence(rank: int, world_size: int, mode: str):
    """``lose_a_key`` for an EmbeddingCollection whose two tables are sliced over the
    ranks (one in reverse rank order): one training step of global batch 0, a key of it
    erased from rank 1's slice of table a, then batch 0 again. Returns the same triple."""
    case = plans.Case("EXACT_SGD", sequence=True)
    model = plans.build_model(case, "column_wise", world_size,
                              safe_check_mode=DynamicEmbCheckMode[mode])  # fmt: skip
    try:
        plans.step(model, rank, world_size, 0)
    except RuntimeError as e:
        return str(e), None, []
    if rank == 1:
        assert dynamic_tables(model)["a"].erase(plans.erased_keys()[:1]) == 1
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            plans.step(model, rank, world_size, 0)
            error = None
        except RuntimeError as e:
            error = str(e)
    return None, error, [str(w.message) for w in caught if "dynamic table" in str(w.message)]


def lose_a_key(rank: int, world_size: int, mode: str, steps: int):
    """Trains ``steps`` steps with both tables in safe_check_mode ``mode`` (the slices
    evict, and agree), then erases one key of the last batch from the last rank's slice
    only and runs that batch again. Returns ``(error of the training steps, error of the
    forward after the erase, dynemb's warnings of that forward)`` (messages, or None)."""
    model = build_model(Case("EXACT_SGD", "SUM"), world_size,
                        safe_check_mode=DynamicEmbCheckMode[mode])  # fmt: skip

    def forward(step: int):
        lengths, keys = global_batch(step, BATCH * world_size, len(FEATURES))
        out = model(local_kjt(lengths, keys, rank * BATCH, (rank + 1) * BATCH)).to_dict()
        return torch.cat([out[f] for f in FEATURES], dim=1), keys[: int(lengths[0].sum())]

    try:
        for step in range(steps):
            values, cw_keys = forward(step)
            values.sum().backward()
    except RuntimeError as e:
        return str(e), None, []
    if rank == world_size - 1:
        assert dynamic_tables(model)["cw"].erase(cw_keys[:1]) == 1
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            forward(steps - 1)
            error = None
        except RuntimeError as e:
            error = str(e)
    return None, error, [str(w.message) for w in caught if "dynamic table" in str(w.message)]


def train_column_wise(rank: int, world_size: int, cases: list[Case], path: str):
    """Per case: this rank's outputs, and its dynamic tables' entries after training;
    then what DynamicEmbDump(format="dynamicemb") says of the last model (DynamicEmb's
    layout refuses column slices; dynemb's format takes them, see tests/checkpoint)."""
    from dynemb.dump_load import DynamicEmbDump

    results = []
    for case in cases:
        model = build_model(case, world_size)
        outputs = []
        for step in range(STEPS):
            lengths, keys = global_batch(step, BATCH * world_size, len(FEATURES))
            out = model(local_kjt(lengths, keys, rank * BATCH, (rank + 1) * BATCH)).to_dict()
            values = torch.cat([out[f] for f in FEATURES], dim=1)
            grad = out_grad(step, BATCH * world_size, CW_DIM + RW_DIM)
            (values * grad[rank * BATCH : (rank + 1) * BATCH]).sum().backward()
            outputs.append(values.detach().clone())
        tables = {name: entries(t) for name, t in dynamic_tables(model).items()}
        results.append((outputs, tables))
    try:
        DynamicEmbDump(path, model, format="dynamicemb")
        refused = None
    except ValueError as e:
        refused = str(e)
    return results, refused


def train_reference(case: Case, world_size: int):
    """The unsharded runs: each slice a table of its own (its width and column offset)
    fed the column-wise table's ids, then the row-wise table; and the column-wise table
    whole (``full``), fed the same ids and its columns' gradients. Returns ``(tables,
    outputs, full, full_outputs)``."""
    width = CW_DIM // world_size
    slices = [
        dataclasses.replace(_options("cw", width), column_offset=r * width)
        for r in range(world_size)
    ]
    common = dict(
        pooling_mode=DynamicEmbPoolingMode[case.pooling],
        optimizer=optimizer_type_of(case.optimizer),
        learning_rate=LR,
        eps=1e-3,
        **optimizer_kwargs(case.optimizer),
    )
    tables = BatchedDynamicEmbeddingTables(
        [*slices, _options("rw", RW_DIM)],
        [*range(world_size), world_size],
        table_names=[*(f"cw{r}" for r in range(world_size)), "rw"],
        **common,
    )
    full = BatchedDynamicEmbeddingTables(
        [_options("cw", CW_DIM)], [0], table_names=["cw"], **common
    )
    scale = 1.0 / world_size if get_gradient_division() else 1.0
    outputs, full_outputs = [], []
    batch = BATCH * world_size
    for step in range(STEPS):
        lengths, keys = global_batch(step, batch, len(FEATURES))
        first = int(lengths[0].sum())
        grad = out_grad(step, batch, CW_DIM + RW_DIM)
        zero = torch.zeros(1, dtype=torch.int64)
        out = full(keys[:first], torch.cat([zero, lengths[0].cumsum(0)]))
        (out * grad[:, :CW_DIM]).sum().mul(scale).backward()
        full_outputs.append(out.detach().clone())
        # The cw feature once per slice, then the rw feature.
        lengths = torch.cat([lengths[:1].repeat(world_size, 1), lengths[1:]])
        keys = torch.cat([keys[:first].repeat(world_size), keys[first:]])
        offsets = torch.cat([zero, lengths.flatten().cumsum(0)])
        out = tables(keys, offsets)
        (out * grad).sum().mul(scale).backward()
        outputs.append(out.detach().clone())
    return tables, outputs, full, full_outputs
