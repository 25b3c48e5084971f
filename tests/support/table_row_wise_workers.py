"""Rank-side code of tests/shard/test_table_row_wise.py: an EmbeddingBagCollection of two
dynamic tables sharded table-row-wise (``near`` on the first node, ``far`` on the last;
``local_size`` ranks a node), and its unsharded reference.

``near`` never evicts: its reference is the whole table trained on the global batch.
``far`` evicts (each rank's shard holds ``SMALL`` rows): a shard evicts among its own
keys, so its reference is one table per rank of the node, fed the keys the routing
sends there, in the order that rank receives them (TorchRec's staggered all-to-all:
local rank by local rank, then node by node), their partial sums added as TorchRec's
reduce-scatter does.
"""

import dataclasses
import os

import torch
import torch.distributed as dist
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
from torchrec.distributed.comm_ops import get_gradient_division
from torchrec.distributed.sharding_plan import construct_module_sharding_plan, table_row_wise
from torchrec.modules.embedding_configs import PoolingType

from dynemb import BatchedDynamicEmbeddingTables, DynamicEmbPoolingMode, DynamicEmbScoreStrategy
from dynemb.distributed.routing import route_keys
from dynemb.distributed.sharding_names import DYNAMIC_KERNEL_NAME
from dynemb.optimizer import optimizer_type_of
from dynemb.shard import DynamicEmbeddingBagCollectionSharder
from tests.support.ftrl_reference import optimizer_kwargs
from tests.support.plan_entries import dynamic_entry, sharded_model
from tests.support.sharded_workers import dynamic_tables, table_options

DIM = 8
ROWS = 64  # num_embeddings (nominal: the keys are raw ids far beyond it)
SMALL = 16  # rows of each shard of ``far``: it evicts
LARGE = 256
TABLES = ("near", "far")
DIST_TYPES = {"near": "hash_roundrobin", "far": "roundrobin"}
BATCH = 4  # samples per rank
STEPS = 10
LR = 0.05


@dataclasses.dataclass(frozen=True)
class Case:
    optimizer: str
    pooling: str  # SUM or MEAN

    def fused_params(self) -> dict:
        return {
            "optimizer": optimizer_type_of(self.optimizer), "learning_rate": LR, "eps": 1e-3,
            **optimizer_kwargs(self.optimizer),
        }  # fmt: skip


def features() -> list[str]:
    return [f"f_{name}" for name in TABLES]


def dynamic_options(name: str):
    options = table_options(DIM, DIST_TYPES[name], SMALL if name == "far" else LARGE)
    options.bucket_capacity = SMALL
    options.score_strategy = DynamicEmbScoreStrategy.STEP  # scores comparable across runs
    return options


def table_node(name: str, world_size: int, local_size: int) -> int:
    return 0 if name == "near" else world_size // local_size - 1


def _configs(case: Case) -> list[EmbeddingBagConfig]:
    return [
        EmbeddingBagConfig(
            name=name,
            embedding_dim=DIM,
            num_embeddings=ROWS,
            feature_names=[feature],
            pooling=PoolingType[case.pooling],
        )
        for name, feature in zip(TABLES, features(), strict=True)
    ]


def build_model(case: Case, world_size: int, local_size: int):
    configs = _configs(case)
    module = EmbeddingBagCollection(tables=configs, device=torch.device("meta"))
    sharder = DynamicEmbeddingBagCollectionSharder(fused_params=case.fused_params())
    per_param = {
        name: table_row_wise(host_index=table_node(name, world_size, local_size)) for name in TABLES
    }
    mplan = construct_module_sharding_plan(
        module, per_param_sharding=per_param, local_size=local_size, world_size=world_size,
        device_type="cpu", sharder=sharder,
    )  # fmt: skip
    for name in TABLES:
        mplan[name] = dynamic_entry(
            mplan[name], dynamic_options(name), compute_kernel=DYNAMIC_KERNEL_NAME
        )
    return sharded_model(module, mplan, sharder)


def global_batch(step: int, batch_size: int):
    """Feature-major lengths (features, batch) and per feature its keys, the same on
    every rank: raw ids far beyond num_embeddings, both parities (``far`` is routed
    ``key mod local_size``)."""
    g = torch.Generator().manual_seed(500 + step)
    lengths = torch.randint(0, 4, (len(TABLES), batch_size), generator=g)
    parts = []
    for f in range(len(TABLES)):
        ids = torch.randint(0, ROWS, (int(lengths[f].sum()),), generator=g)
        parts.append(ids * (1 << 40) + ids)
    return lengths, parts


def feature_grad(step: int, f: int, rows: int) -> torch.Tensor:
    return torch.randn(rows, DIM, generator=torch.Generator().manual_seed(30 + 10 * step + f))


def entries(table) -> dict[str, torch.Tensor]:
    keys, values, scores, _ = table.export_batch(0, max(1, table.capacity()), include_extra=True)
    order = torch.argsort(keys)
    return {"keys": keys[order], "values": values[order], "scores": scores[order]}


def train_twrw(
    rank: int, world_size: int, local_size: int, cases: list[Case], batch_sizes: list[int]
):
    """Per case: this rank's outputs (per step, per feature) and its tables' entries."""
    os.environ["LOCAL_WORLD_SIZE"] = str(local_size)  # TorchRec's node size
    results = []
    for case in cases:
        model = build_model(case, world_size, local_size)
        outputs = train(model, rank, batch_sizes, range(STEPS))
        tables = {name: entries(t) for name, t in dynamic_tables(model).items()}
        results.append((outputs, tables))
    return results


def _reference_table(case: Case, name: str, pooling: str) -> BatchedDynamicEmbeddingTables:
    return BatchedDynamicEmbeddingTables(
        [dynamic_options(name)],
        [0],
        pooling_mode=DynamicEmbPoolingMode[pooling],
        optimizer=optimizer_type_of(case.optimizer),
        learning_rate=LR,
        eps=1e-3,
        **optimizer_kwargs(case.optimizer),
        table_names=[name],
    )


def received_order(world_size: int, local_size: int) -> list[int]:
    """The source ranks in the order a rank receives their samples (TorchRec's stagger)."""
    nodes = world_size // local_size
    return [local + node * local_size for local in range(local_size) for node in range(nodes)]


def _shard_outputs(tables, keys, lengths, batch_sizes: list[int], local_size: int) -> torch.Tensor:
    """The partial sums of every shard of ``far`` (tables: one per local rank), added,
    in global sample order: each shard gets its keys in the order it receives them."""
    owner, _ = route_keys(keys, DIST_TYPES["far"], local_size, ROWS)
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
    samples = [
        s
        for r in received_order(len(batch_sizes), local_size)
        for s in range(sum(batch_sizes[:r]), sum(batch_sizes[: r + 1]))
    ]
    total = 0
    for b, table in enumerate(tables):
        bag_keys, bag_lengths = [], []
        for s in samples:
            bag = keys[offsets[s] : offsets[s + 1]]
            bag = bag[owner[offsets[s] : offsets[s + 1]] == b]
            bag_keys.append(bag)
            bag_lengths.append(bag.numel())
        bag_offsets = torch.cat(
            [torch.zeros(1, dtype=torch.int64), torch.tensor(bag_lengths).cumsum(0)]
        )
        out = table(torch.cat(bag_keys), bag_offsets)
        placed = torch.empty_like(out)
        placed[torch.tensor(samples)] = out
        total = total + placed
    return total


def train_reference(case: Case, batch_sizes: list[int], local_size: int):
    """The unsharded run on the global batch. Returns ``(tables, outputs)``: ``near``
    (the whole table) and ``far0``, ``far1``, ... (its shards' references, by local
    rank), and per step the global output of each feature."""
    tables = {"near": _reference_table(case, "near", case.pooling)}
    for b in range(local_size):
        tables[f"far{b}"] = _reference_table(case, "far", "SUM")
    scale = 1.0 / len(batch_sizes) if get_gradient_division() else 1.0
    batch = sum(batch_sizes)
    outputs = []
    for step in range(STEPS):
        lengths, parts = global_batch(step, batch)
        grads = [feature_grad(step, f, batch) * scale for f in range(len(TABLES))]
        offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths[0].cumsum(0)])
        near = tables["near"](parts[0], offsets)
        shards = [tables[f"far{b}"] for b in range(local_size)]
        far = _shard_outputs(shards, parts[1], lengths[1], batch_sizes, local_size)
        if case.pooling == "MEAN":
            far = far / lengths[1].clamp(min=1).unsqueeze(1)
        ((near * grads[0]).sum() + (far * grads[1]).sum()).backward()
        outputs.append([near.detach(), far.detach()])
    return tables, outputs


def train(model, rank: int, batch_sizes: list[int], steps: range) -> list[list[torch.Tensor]]:
    """Trains on this rank's samples of each step's global batch; returns per step the
    output of each feature."""
    outputs = []
    start = sum(batch_sizes[:rank])
    stop = start + batch_sizes[rank]
    total = sum(batch_sizes)
    for step in steps:
        lengths, parts = global_batch(step, total)
        mine = [
            p[int(lengths[f, :start].sum()) : int(lengths[f, :stop].sum())]
            for f, p in enumerate(parts)
        ]
        kjt = KeyedJaggedTensor(
            keys=features(), values=torch.cat(mine), lengths=lengths[:, start:stop].flatten()
        )
        out = model(kjt)
        loss = 0
        for f, feature in enumerate(features()):
            loss = loss + (out[feature] * feature_grad(step, f, total)[start:stop]).sum()
        loss.backward()
        outputs.append([out[feature].detach().clone() for feature in features()])
    return outputs


def checkpoint_round_trip(rank: int, world_size: int, local_size: int, case: Case, path: str):
    """Trains, dumps (dynemb's format, optimizer state included), loads into a fresh
    model of the same plan. Returns this rank's entries of both, and the outputs of
    two more steps of each."""
    from dynemb.dump_load import DynamicEmbDump, DynamicEmbLoad

    os.environ["LOCAL_WORLD_SIZE"] = str(local_size)
    first = build_model(case, world_size, local_size)
    batch_sizes = [BATCH] * world_size
    train(first, rank, batch_sizes, range(STEPS))
    DynamicEmbDump(path, first, optim=True)
    second = build_model(case, world_size, local_size)
    DynamicEmbLoad(path, second, optim=True)
    saved = [{name: entries(t) for name, t in dynamic_tables(m).items()} for m in (first, second)]
    more = range(STEPS, STEPS + 2)
    return saved, [train(m, rank, batch_sizes, more) for m in (first, second)]


def planned_placement(rank: int, world_size: int, local_size: int, case: Case):
    """Plans the module with the planner, every table constrained to table_row_wise,
    trains it a few steps. Returns the plan's ranks and this rank's keys per table."""
    from torchrec.distributed.planner import Topology

    from dynemb.planner import DynamicEmbeddingShardingPlanner, DynamicEmbParameterConstraints

    os.environ["LOCAL_WORLD_SIZE"] = str(local_size)
    configs = _configs(case)
    module = EmbeddingBagCollection(tables=configs, device=torch.device("meta"))
    sharder = DynamicEmbeddingBagCollectionSharder(fused_params=case.fused_params())
    constraints = {
        name: DynamicEmbParameterConstraints(
            use_dynamicemb=True,
            sharding_types=["table_row_wise"],
            dynamicemb_options=dataclasses.replace(
                dynamic_options(name), max_capacity=None, bucket_capacity=16
            ),
        )
        for name in TABLES
    }
    topology = Topology(world_size=world_size, local_world_size=local_size, compute_device="cpu")
    planner = DynamicEmbeddingShardingPlanner(
        configs, topology, constraints=constraints, debug=False
    )
    plan = planner.collective_plan(module, [sharder])
    model = sharded_model(module, plan, sharder)
    train(model, rank, [BATCH] * world_size, range(3))
    entries_ = plan.plan[""]
    ranks = {name: list(entries_[name].ranks) for name in TABLES}
    types = {name: entries_[name].sharding_type for name in TABLES}
    keys = {name: entries(t)["keys"] for name, t in dynamic_tables(model).items()}
    return types, ranks, keys


def ordinary_beside_dynamic(rank: int, world_size: int, local_size: int):
    """An ordinary table (TorchRec's kernel, 41 rows: uneven blocks) sharded
    table-row-wise on the last node beside the dynamic ``near``, in one TWRW sharding.
    Returns this rank's pooled output of the ordinary feature and what it should be
    (its ids' rows, from the table's shards gathered), and this rank's shard rows."""
    rows = 41
    os.environ["LOCAL_WORLD_SIZE"] = str(local_size)
    configs = [
        EmbeddingBagConfig(name=n, embedding_dim=DIM, num_embeddings=rows, feature_names=[f"f_{n}"])
        for n in ("near", "ord")
    ]
    module = EmbeddingBagCollection(tables=configs, device=torch.device("meta"))
    sharder = DynamicEmbeddingBagCollectionSharder(
        fused_params=Case("EXACT_SGD", "SUM").fused_params()
    )
    per_param = {
        "near": table_row_wise(host_index=0),
        "ord": table_row_wise(host_index=world_size // local_size - 1),
    }
    mplan = construct_module_sharding_plan(
        module, per_param_sharding=per_param, local_size=local_size, world_size=world_size,
        device_type="cpu", sharder=sharder,
    )  # fmt: skip
    mplan["near"] = dynamic_entry(
        mplan["near"], dynamic_options("near"), compute_kernel=DYNAMIC_KERNEL_NAME
    )
    model = sharded_model(module, mplan, sharder)
    table = torch.zeros(rows, DIM)
    shards = model.state_dict()["embedding_bags.ord.weight"].local_shards()
    for shard in shards:
        offset = shard.metadata.shard_offsets[0]
        table[offset : offset + shard.tensor.shape[0]] = shard.tensor
    dist.all_reduce(table)  # each row is on one rank
    ids = torch.randint(0, rows, (2 * BATCH,), generator=torch.Generator().manual_seed(rank))
    lengths = torch.tensor([1] * BATCH + [2] * BATCH)  # near: one id a bag; ord: two
    kjt = KeyedJaggedTensor(
        keys=["f_near", "f_ord"],
        values=torch.cat([ids[:BATCH] * (1 << 40) + 1, ids]),
        lengths=lengths,
    )
    got = model(kjt)["f_ord"].detach()
    want = table[ids].view(BATCH, 2, DIM).sum(1)
    return got, want, [shard.tensor.shape[0] for shard in shards]
