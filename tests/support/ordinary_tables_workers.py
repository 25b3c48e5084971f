"""Rank-side code of tests/shard/test_ordinary_tables_as_dynamic.py: a model mixing an ordinary
table and a dynamic table, trained with Adam on CPU through DistributedModelParallel
with the planner's ``ordinary_tables_as_dynamic``, checked against torch.optim.Adam."""

import io

import torch
import torch.distributed as dist
from torch.distributed._shard.sharded_tensor import ShardedTensor
from torchrec import (
    EmbeddingBagCollection,
    EmbeddingBagConfig,
    EmbeddingCollection,
    EmbeddingConfig,
    KeyedJaggedTensor,
)
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.planner import ParameterConstraints, Topology
from torchrec.distributed.types import ShardingEnv

from dynemb import DynamicEmbDump, DynamicEmbLoad, DynamicEmbTableOptions
from dynemb.optimizer import EmbOptimType
from dynemb.planner import DynamicEmbeddingShardingPlanner, DynamicEmbParameterConstraints
from dynemb.shard import (
    DynamicEmbeddingBagCollectionSharder,
    DynamicEmbeddingCollectionSharder,
    dynamic_embedding_tables,
)

ROWS = 13  # ordinary table: blocks of 7 and 6 ids on 2 ranks
DIM = 4
BATCH = 4  # bags per rank and feature
ADAM = {"lr": 0.05, "betas": (0.8, 0.95), "eps": 1e-3}
FUSED = {
    "optimizer": EmbOptimType.ADAM,
    "learning_rate": ADAM["lr"],
    "beta1": ADAM["betas"][0],
    "beta2": ADAM["betas"][1],
    "eps": ADAM["eps"],
}


def _country_init(weight: torch.Tensor) -> torch.Tensor:
    # Not TorchRec's default range: shows that the config's init_fn made the rows.
    return torch.nn.init.uniform_(weight, 0.2, 0.3)


def _configs(config=EmbeddingBagConfig) -> list:
    return [
        config(name="country", embedding_dim=DIM, num_embeddings=ROWS, feature_names=["c"],
               init_fn=_country_init),
        config(name="user", embedding_dim=DIM, num_embeddings=64, feature_names=["u"]),
    ]  # fmt: skip


def _model(world_size: int, switch: bool = True, sequence: bool = False, fused=None, device="meta"):
    if sequence:
        configs = _configs(EmbeddingConfig)
        sharder = DynamicEmbeddingCollectionSharder(fused_params=fused or FUSED)
    else:
        configs = _configs()
        sharder = DynamicEmbeddingBagCollectionSharder(fused_params=fused or FUSED)
    planner = DynamicEmbeddingShardingPlanner(
        configs,
        topology=Topology(world_size=world_size, compute_device="cpu"),
        batch_size=BATCH,
        constraints={
            "user": DynamicEmbParameterConstraints(
                use_dynamicemb=True,
                dynamicemb_options=DynamicEmbTableOptions(dist_type="hash_roundrobin"),
            ),
            "country": ParameterConstraints(sharding_types=["row_wise"]),
        },
        ordinary_tables_as_dynamic=switch,
    )
    collection = EmbeddingCollection if sequence else EmbeddingBagCollection
    ebc = collection(tables=configs, device=torch.device(device))
    plan = planner.collective_plan(ebc, [sharder], dist.group.WORLD)
    return DistributedModelParallel(
        ebc,
        env=ShardingEnv.from_process_group(dist.group.WORLD),
        plan=plan,
        sharders=[sharder],
        device=torch.device("cpu"),
    )


def _batch(step: int, rank: int) -> KeyedJaggedTensor:
    """Bag 0 of "c" holds every id (so every row gets a gradient at every step, as
    torch.optim.Adam's dense update assumes); the others are random. "u": raw ids."""
    g = torch.Generator().manual_seed(1000 * step + rank)
    lengths = torch.randint(0, 4, (2, BATCH), generator=g)
    lengths[0, 0] = ROWS
    c = torch.randint(0, ROWS, (int(lengths[0].sum()),), generator=g)
    c[:ROWS] = torch.randperm(ROWS, generator=g)
    u = torch.randint(-(1 << 40), 1 << 40, (int(lengths[1].sum()),), generator=g)
    return KeyedJaggedTensor(keys=["c", "u"], values=torch.cat([c, u]), lengths=lengths.flatten())


def _grad(step: int, rank: int) -> torch.Tensor:
    return torch.randn(BATCH, DIM, generator=torch.Generator().manual_seed(7 * step + rank))


def _table(model, name: str):
    for group in dynamic_embedding_tables(model).values():
        if name in group.table_names:
            return group.tables[group.table_names.index(name)]
    raise KeyError(name)


def _ordinary_weight(model) -> torch.Tensor:
    """The whole ordinary table (ROWS, DIM), gathered from the ranks' blocks."""
    table = _table(model, "country")
    rows, found = table.find(torch.arange(ROWS))
    parts = [None] * dist.get_world_size()
    dist.all_gather_object(parts, (found, rows))
    weight = torch.zeros(ROWS, DIM)
    for owned, values in parts:
        weight[owned] = values[owned]
    assert bool(torch.stack([owned for owned, _ in parts]).sum(0).eq(1).all()), "one owner per id"
    return weight


def ordinary_table_trains_like_torch_adam(rank: int, world_size: int) -> None:
    torch.manual_seed(rank)
    model = _model(world_size)
    entry = model.plan.plan[""]["country"]
    assert entry.ordinary_table and entry.dynamicemb_options.dist_type == "continuous"

    # Every row of the rank's block is stored, made by the config's init_fn (DMP's
    # reset_parameters, as for TorchRec's tables), distinct per row.
    block = -(-ROWS // world_size)
    own = range(rank * block, min((rank + 1) * block, ROWS))
    assert _table(model, "country").size() == len(own)
    weight = _ordinary_weight(model)
    assert bool(((weight >= 0.2) & (weight <= 0.3)).all()), weight
    assert weight.unique().numel() == weight.numel()

    reference = torch.nn.EmbeddingBag(ROWS, DIM, mode="sum", include_last_offset=True)
    with torch.no_grad():
        reference.weight.copy_(weight)
    adam = torch.optim.Adam(reference.parameters(), **ADAM)
    user = _table(model, "user")
    for step in range(4):
        out = model(_batch(step, rank)).to_dict()
        # The oracle sees every rank's batch. TorchRec's row-wise backward divides by
        # the world size (get_gradient_division): the loss is the ranks' mean.
        adam.zero_grad()
        loss = 0
        for r in range(world_size):
            kjt = _batch(step, r)["c"]
            expected = reference(kjt.values(), kjt.offsets())
            if r == rank:
                torch.testing.assert_close(out["c"], expected.detach(), atol=1e-6, rtol=0)
            loss = loss + (expected * _grad(step, r)).sum()
        (loss / world_size).backward()
        adam.step()
        user_before = user.find(user.export_batch(0, user.capacity())[0])[0]
        ((out["c"] * _grad(step, rank)).sum() + out["u"].sum()).backward()
        user_after = user.find(user.export_batch(0, user.capacity())[0])[0]
        assert not torch.equal(user_before, user_after), "the dynamic table trains too"
        torch.testing.assert_close(
            _ordinary_weight(model), reference.weight.detach(), atol=1e-5, rtol=1e-5
        )
    # Nothing was inserted beyond the block; eval reads the trained rows.
    assert _table(model, "country").size() == len(own)
    model.eval()
    kjt = _batch(9, rank)
    expected = reference(kjt["c"].values(), kjt["c"].offsets()).detach()
    torch.testing.assert_close(model(kjt).to_dict()["c"], expected, atol=1e-6, rtol=0)


def ordinary_table_checkpoint_round_trip(rank: int, world_size: int, path: str) -> torch.Tensor:
    torch.manual_seed(rank)
    model = _model(world_size)
    for step in range(2):
        out = model(_batch(step, rank)).to_dict()
        ((out["c"] * _grad(step, rank)).sum() + out["u"].sum()).backward()
    DynamicEmbDump(path, model, optim=True)
    torch.manual_seed(100 + rank)
    restored = _model(world_size)
    assert not torch.equal(_ordinary_weight(restored), _ordinary_weight(model))
    DynamicEmbLoad(path, restored, optim=True)
    saved = _ordinary_weight(model)
    torch.testing.assert_close(_ordinary_weight(restored), saved, atol=0, rtol=0)
    # Adam's state and step came back too: one more step gives the same rows.
    for m in (model, restored):
        out = m(_batch(5, rank)).to_dict()
        ((out["c"] * _grad(5, rank)).sum() + out["u"].sum()).backward()
    torch.testing.assert_close(_ordinary_weight(restored), _ordinary_weight(model), atol=0, rtol=0)
    return saved


def ordinary_table_checkpoint_loads(rank: int, world_size: int, path: str) -> torch.Tensor:
    """The whole ordinary table after loading ``path`` into a fresh model of this world."""
    model = _model(world_size)
    DynamicEmbLoad(path, model, optim=True)
    block = -(-ROWS // world_size)
    assert _table(model, "country").size() == len(range(ROWS)[rank * block : (rank + 1) * block])
    return _ordinary_weight(model)


def out_of_range_ids_are_rejected(rank: int, world_size: int, bad_ids: list[int]) -> list[str]:
    """The message of each bad id's batch; the table is unchanged after each."""
    model = _model(world_size)
    table = _table(model, "country")
    before, size = table.find(torch.arange(ROWS))[0], table.size()
    messages = []
    for bad_id in bad_ids:
        kjt = KeyedJaggedTensor(
            keys=["c", "u"],
            values=torch.tensor([1, bad_id, 5]),
            lengths=torch.tensor([2, 0, 0, 0, 1, 0, 0, 0]),
        )
        try:
            model(kjt)
        except ValueError as e:
            messages.append(str(e))
        else:
            raise AssertionError(f"id {bad_id} was accepted")
        assert torch.equal(table.find(torch.arange(ROWS))[0], before)
        assert table.size() == size
    return messages


def adam_without_the_switch_is_a_clear_error(rank: int, world_size: int) -> str:
    try:
        _model(world_size, switch=False)
    except ValueError as e:
        return str(e)
    raise AssertionError("an ordinary table was given Adam on CPU without an error")


def ordinary_table_in_ec_trains_like_torch_adam(rank: int, world_size: int) -> None:
    """The same with an EmbeddingCollection (sequence: one row per id)."""
    torch.manual_seed(rank)
    model = _model(world_size, sequence=True)
    reference = torch.nn.Embedding(ROWS, DIM)
    with torch.no_grad():
        reference.weight.copy_(_ordinary_weight(model))
    weight = model.state_dict()["embeddings.country.weight"]
    assert isinstance(weight, ShardedTensor) and weight.size() == (ROWS, DIM)
    for shard in weight.local_shards():
        start, rows = shard.metadata.shard_offsets[0], shard.metadata.shard_sizes[0]
        torch.testing.assert_close(shard.tensor, reference.weight.detach()[start : start + rows])
    adam = torch.optim.Adam(reference.parameters(), **ADAM)
    for step in range(3):
        out = model(_batch(step, rank))
        adam.zero_grad()
        loss = 0
        for r in range(world_size):
            ids = _batch(step, r)["c"].values()
            grad = torch.randn(ids.numel(), DIM, generator=torch.Generator().manual_seed(r))
            expected = reference(ids)
            if r == rank:
                torch.testing.assert_close(out["c"].values(), expected.detach(), atol=1e-5, rtol=0)
                mine = grad
            loss = loss + (expected * grad).sum()
        (loss / world_size).backward()
        adam.step()
        ((out["c"].values() * mine).sum() + out["u"].values().sum()).backward()
        torch.testing.assert_close(
            _ordinary_weight(model), reference.weight.detach(), atol=1e-5, rtol=1e-5
        )


def state_dict_holds_the_rows_as_torchrec(rank: int, world_size: int) -> None:
    torch.manual_seed(rank)
    model = _model(world_size)
    key = "embedding_bags.country.weight"
    state = model.state_dict()
    weight = state[key]
    assert isinstance(weight, ShardedTensor) and weight.size() == (ROWS, DIM)
    # The same layout as TorchRec's own row-wise table (SGD: its CPU kernel has no Adam).
    sgd = {"optimizer": EmbOptimType.EXACT_SGD, "learning_rate": 0.1}
    plain = _model(world_size, switch=False, fused=sgd).state_dict()[key]
    assert plain.metadata().shards_metadata == weight.metadata().shards_metadata
    assert [s.metadata for s in plain.local_shards()] == [s.metadata for s in weight.local_shards()]
    torch.testing.assert_close(
        torch.cat([s.tensor for s in weight.local_shards()]),
        _table(model, "country").find(torch.arange(ROWS))[0][
            _table(model, "country").contains(torch.arange(ROWS))
        ],
    )

    # torch.save / load_state_dict restores the rows after training moved them.
    buffer = io.BytesIO()
    torch.save(state, buffer)
    saved = _ordinary_weight(model)
    out = model(_batch(0, rank)).to_dict()
    ((out["c"] * _grad(0, rank)).sum() + out["u"].sum()).backward()
    assert not torch.equal(_ordinary_weight(model), saved)
    buffer.seek(0)
    model.load_state_dict(torch.load(buffer, weights_only=False))
    torch.testing.assert_close(_ordinary_weight(model), saved, atol=0, rtol=0)

    # A whole (num_embeddings, dim) weight, e.g. an unsharded model's, loads too.
    whole = torch.randn(ROWS, DIM, generator=torch.Generator().manual_seed(5))
    model.load_state_dict({key: whole}, strict=False)
    torch.testing.assert_close(_ordinary_weight(model), whole, atol=0, rtol=0)

    # A wrong shape is refused, naming the key, and changes nothing.
    try:
        model.load_state_dict({key: torch.zeros(ROWS + 1, DIM)}, strict=False)
    except ValueError as e:
        assert key in str(e) and f"({ROWS}, {DIM})" in str(e), str(e)
    else:
        raise AssertionError("a wrong shape was loaded")
    torch.testing.assert_close(_ordinary_weight(model), whole, atol=0, rtol=0)


def rows_of_a_cpu_module_follow_init_fn_as_torchrec(rank: int, world_size: int) -> None:
    """A module built on CPU (not meta): TorchRec's own row-wise table gets its rows from
    the config's init_fn (uniform(0.2, 0.3)); so does the table held as a dynamic one."""
    torch.manual_seed(rank)
    sgd = {"optimizer": EmbOptimType.EXACT_SGD, "learning_rate": 0.1}
    plain = _model(world_size, switch=False, fused=sgd, device="cpu").state_dict()
    for weight in (
        torch.cat([s.tensor for s in plain["embedding_bags.country.weight"].local_shards()]),
        _ordinary_weight(_model(world_size, device="cpu")),
    ):
        assert bool(((weight >= 0.2) & (weight <= 0.3)).all()), weight
        assert weight.unique().numel() == weight.numel()
