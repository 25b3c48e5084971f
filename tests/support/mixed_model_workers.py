"""Rank-side code of tests/shard/test_sharded_behaviour.py: a model mixing dynamic and ordinary
TorchRec tables, checked against plain TorchRec, plus LR, eval and state_dict behaviour."""

import dataclasses
import io

import torch
import torch.distributed as dist
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.sharding_plan import (
    construct_module_sharding_plan,
    row_wise,
    table_wise,
)
from torchrec.distributed.types import ShardingEnv, ShardingPlan
from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper
from torchrec.optim.optimizers import in_backward_optimizer_filter

from dynemb.optimizer import EmbOptimType
from dynemb.planner.parameter_sharding import DynamicEmbParameterSharding
from dynemb.shard import DynamicEmbeddingBagCollectionSharder, dynamic_embedding_tables
from tests.support.sharded_workers import table_options

ROWS = 40
FUSED = {"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD, "learning_rate": 0.05, "eps": 1e-3}
BATCH = 3  # per rank; even, because TorchRec's own row-wise backward needs it on gloo


def _init(weight: torch.Tensor) -> torch.Tensor:
    # Deterministic per shard shape: both models start ordinary tables identically.
    g = torch.Generator().manual_seed(11)
    with torch.no_grad():
        return weight.copy_(torch.rand(weight.shape, generator=g) - 0.5)


def _configs(dynamic: bool) -> list[EmbeddingBagConfig]:
    configs = [
        EmbeddingBagConfig(name="t1", embedding_dim=4, num_embeddings=ROWS, feature_names=["f1"], init_fn=_init),
        EmbeddingBagConfig(name="t2", embedding_dim=8, num_embeddings=ROWS, feature_names=["f2"], init_fn=_init),
    ]  # fmt: skip
    if dynamic:
        configs.insert(
            0,
            EmbeddingBagConfig(
                name="t0", embedding_dim=4, num_embeddings=ROWS, feature_names=["f0"]
            ),
        )
    return configs


def _model(dynamic: bool, world_size: int):
    module = EmbeddingBagCollection(tables=_configs(dynamic), device=torch.device("meta"))
    if dynamic:
        sharder = DynamicEmbeddingBagCollectionSharder(fused_params=FUSED)
    else:
        sharder = EmbeddingBagCollectionSharder(fused_params=FUSED)
    per_param = {
        "t1": row_wise(compute_kernel="fused"),
        "t2": table_wise(rank=world_size - 1, compute_kernel="fused"),
    }
    if dynamic:
        per_param["t0"] = row_wise(compute_kernel="customized_kernel")
    mplan = construct_module_sharding_plan(
        module, per_param_sharding=per_param, local_size=world_size, world_size=world_size,
        device_type="cpu", sharder=sharder,
    )  # fmt: skip
    if dynamic:
        base = mplan["t0"]
        fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(base)}
        mplan["t0"] = DynamicEmbParameterSharding(
            **fields, dynamicemb_options=table_options(4, "hash_roundrobin", 256)
        )
    env = ShardingEnv.from_process_group(dist.group.WORLD)
    return DistributedModelParallel(
        module,
        env=env,
        plan=ShardingPlan({"": mplan}),
        sharders=[sharder],
        device=torch.device("cpu"),
    )


def _batch(step: int, rank: int, dynamic: bool) -> KeyedJaggedTensor:
    g = torch.Generator().manual_seed(100 * step + rank)
    lengths = torch.randint(0, 3, (3, BATCH), generator=g)
    keys = torch.randint(0, ROWS, (int(lengths.sum()),), generator=g)
    n0 = int(lengths[0].sum())
    keys[:n0] = keys[:n0] * (1 << 40) - 7  # raw ids, far beyond num_embeddings
    if not dynamic:
        return KeyedJaggedTensor(keys=["f1", "f2"], values=keys[n0:], lengths=lengths[1:].flatten())
    return KeyedJaggedTensor(keys=["f0", "f1", "f2"], values=keys, lengths=lengths.flatten())


def mixed_model_matches_torchrec(rank: int, world_size: int) -> None:
    mixed, plain = _model(True, world_size), _model(False, world_size)
    for step in range(5):
        out_m = mixed(_batch(step, rank, True)).to_dict()
        out_p = plain(_batch(step, rank, False)).to_dict()
        loss_m = loss_p = 0
        for f, width in (("f1", 4), ("f2", 8)):
            torch.testing.assert_close(out_m[f], out_p[f], atol=1e-6, rtol=0)
            grad = torch.randn(BATCH, width, generator=torch.Generator().manual_seed(step))
            loss_m = loss_m + (out_m[f] * grad).sum()
            loss_p = loss_p + (out_p[f] * grad).sum()
        loss_m = loss_m + out_m["f0"].sum()
        loss_m.backward()
        loss_p.backward()
    sd_m, sd_p = mixed.state_dict(), plain.state_dict()
    for key in ("embedding_bags.t1.weight", "embedding_bags.t2.weight"):
        shards_m, shards_p = sd_m[key].local_shards(), sd_p[key].local_shards()
        assert len(shards_m) == len(shards_p)
        for a, b in zip(shards_m, shards_p):
            torch.testing.assert_close(a.tensor, b.tensor, atol=1e-6, rtol=0)


def dynamic_tables_behave_like_torchrec_tables(rank: int, world_size: int) -> None:
    model = _model(True, world_size)
    kjt = _batch(0, rank, True)
    model(kjt).values().sum().backward()

    # model.parameters() never holds a dynamic table; state_dict holds a placeholder.
    names = [n for n, _ in model.named_parameters()]
    assert names and not any(".t0." in n for n in names), names
    state = model.state_dict()
    assert state["embedding_bags.t0.weight"].numel() == 1
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    model.load_state_dict(torch.load(buffer, weights_only=False), strict=False)

    # TorchRec's optimizer plumbing: fused + dense in one CombinedOptimizer (here
    # every parameter is an embedding: the dense filter leaves nothing).
    dense_params = dict(in_backward_optimizer_filter(model.named_parameters()))
    assert not dense_params, list(dense_params)
    extra = torch.nn.Parameter(torch.ones(1))
    dense = KeyedOptimizerWrapper({"extra": extra}, lambda p: torch.optim.SGD(p, lr=0.1))
    combined = CombinedOptimizer([model.fused_optimizer, dense])
    combined.zero_grad()
    model(kjt).values().sum().backward()
    combined.step()
    assert "state" in model.fused_optimizer.state_dict()

    # The fused optimizer's learning rate reaches the dynamic tables.
    (tables,) = dynamic_embedding_tables(model).values()
    table = tables.tables[0]
    keys = table.export_batch(0, table.capacity())[0]  # the ids this rank owns
    assert keys.numel() > 0
    before, found = table.find(keys)
    assert bool(found.all())
    for group in model.fused_optimizer.param_groups:
        group["lr"] = 0.0
    model(kjt).values().sum().backward()
    after, _ = table.find(keys)
    assert torch.equal(before, after), "lr=0 must leave the rows unchanged"
    for group in model.fused_optimizer.param_groups:
        group["lr"] = 0.5
    model(kjt).values().sum().backward()
    changed, _ = table.find(keys)
    assert not torch.equal(before, changed)

    # eval: unknown ids are not inserted and read as zero rows.
    size = table.size()
    model.eval()
    unseen = KeyedJaggedTensor(
        keys=["f0", "f1", "f2"],
        values=torch.tensor([123456789 + rank, 1, 2]),
        lengths=torch.tensor([1, 0, 0, 1, 0, 0, 1, 0, 0]),
    )
    out = model(unseen).to_dict()
    assert torch.equal(out["f0"][0], torch.zeros(4))
    dist.barrier()
    assert table.size() == size
    model.train()
