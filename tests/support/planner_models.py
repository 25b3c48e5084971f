"""The planner tests' model: an EBC and an EC on the meta device with dynamic and ordinary
tables, its constraints and sharders, and helpers to read plans and enumerations."""

import torch
from torchrec.distributed.planner import ParameterConstraints, Topology
from torchrec.modules.embedding_configs import EmbeddingBagConfig, EmbeddingConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection

from dynemb import DynamicEmbInitializerArgs, DynamicEmbTableOptions
from dynemb.planner import DynamicEmbeddingEnumerator, DynamicEmbParameterConstraints
from dynemb.shard import DynamicEmbeddingBagCollectionSharder, DynamicEmbeddingCollectionSharder

ROW_WISE = "row_wise"


DYNAMIC_KERNEL = "customized_kernel"


DYNAMIC_TABLES = ("user", "item", "query")


def bag_configs() -> list[EmbeddingBagConfig]:
    return [
        EmbeddingBagConfig(name="user", embedding_dim=8, num_embeddings=1000, feature_names=["u"]),
        EmbeddingBagConfig(name="item", embedding_dim=16, num_embeddings=40, feature_names=["i"]),
        EmbeddingBagConfig(
            name="country", embedding_dim=8, num_embeddings=300, feature_names=["c"]
        ),
    ]


def sequence_configs() -> list[EmbeddingConfig]:
    return [
        EmbeddingConfig(name="query", embedding_dim=8, num_embeddings=500, feature_names=["q"]),
        EmbeddingConfig(name="lang", embedding_dim=8, num_embeddings=100, feature_names=["l"]),
    ]


def all_configs() -> list:
    return bag_configs() + sequence_configs()


class Model(torch.nn.Module):
    """An EBC and an EC on the meta device, as a planner sees a real model."""

    def __init__(self, bags=None, sequences=None) -> None:
        super().__init__()
        meta = torch.device("meta")
        self.ebc = EmbeddingBagCollection(tables=bags or bag_configs(), device=meta)
        self.ec = EmbeddingCollection(tables=sequences or sequence_configs(), device=meta)


def sharders() -> list:
    return [DynamicEmbeddingBagCollectionSharder(), DynamicEmbeddingCollectionSharder()]


def make_constraints() -> dict:
    return {
        "user": DynamicEmbParameterConstraints(
            use_dynamicemb=True,
            dynamicemb_options=DynamicEmbTableOptions(
                bucket_capacity=128, init_capacity=100, global_hbm_for_values=1001
            ),
        ),
        "item": DynamicEmbParameterConstraints(use_dynamicemb=True),
        "query": DynamicEmbParameterConstraints(
            use_dynamicemb=True,
            pooling_factors=[3.0],
            dynamicemb_options=DynamicEmbTableOptions(
                bucket_capacity=64,
                initializer_args=DynamicEmbInitializerArgs(lower=-0.5),
            ),
        ),
        # An ordinary table with constraints, and one ("lang") without.
        "country": ParameterConstraints(pooling_factors=[1.0]),
    }


def cpu_topology(world_size: int, **kwargs) -> Topology:
    return Topology(world_size=world_size, compute_device="cpu", **kwargs)


def entries(plan) -> dict:
    """{table name: ParameterSharding} over every module of the plan."""
    return {name: ps for module_plan in plan.plan.values() for name, ps in module_plan.items()}


# A dynamic "user" table of 1000 x 8 on 2 ranks: 512 rows per rank.
USER_ROWS_PER_RANK = 512


def enumerate_options(compute_device="cpu", constraints=None, module_sharders=None, ws=2):
    enumerator = DynamicEmbeddingEnumerator(
        topology=Topology(world_size=ws, compute_device=compute_device),
        batch_size=128,
        constraints=make_constraints() if constraints is None else constraints,
    )
    return enumerator.enumerate(Model(), module_sharders or sharders())


def by_table(options) -> dict:
    tables: dict = {}
    for so in options:
        tables.setdefault(so.name, []).append(so)
    return tables
