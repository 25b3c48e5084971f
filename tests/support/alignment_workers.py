"""Rank-side code of test_alignment_combinations.py: DynamicEmb's sizing combinations
(caching, training, bucket_capacity, optimizer, HBM share of the table, dim, tables),
each planned with get_planner and built with DistributedModelParallel on CPU, then the
user's own DynamicEmbTableOptions and the built module read through public names only."""

import itertools
import math
import warnings

import torch
import torch.distributed as dist
from fbgemm_gpu.split_embedding_configs import SparseType
from torchrec import EmbeddingCollection, EmbeddingConfig, KeyedJaggedTensor
from torchrec.distributed.model_parallel import DistributedModelParallel

from dynemb import (
    DynamicEmbInitializerArgs,
    DynamicEmbInitializerMode,
    DynamicEmbScoreStrategy,
    DynamicEmbTableOptions,
    get_sharded_table_capacity,
    get_table_value_bytes,
)
from dynemb.batched_dynamicemb_tables import BatchedDynamicEmbeddingTablesV2
from dynemb.dump_load import find_sharded_modules, get_dynamic_emb_module
from dynemb.dynamicemb_config import DEFAULT_BUCKET_CAPACITY
from dynemb.get_planner import get_planner
from dynemb.optimizer import EmbOptimType
from dynemb.shard import DynamicEmbeddingCollectionSharder
from dynemb.types import MAX_BUCKET_CAPACITY

BUCKETS = [DEFAULT_BUCKET_CAPACITY, 1024, MAX_BUCKET_CAPACITY]
OPTIMIZERS = [EmbOptimType.SGD, EmbOptimType.ADAM, EmbOptimType.EXACT_ROWWISE_ADAGRAD]
HBM_RATIOS = [0.0, 0.25, 1.0]
DIMS = [16, 128]
TABLES = [(7,), (13,), (127,), (1001,), (17, 99)]  # rows of each table of a model


def combinations() -> list[tuple]:
    """(caching, training, bucket, optimizer, hbm_ratio, dim, tables); caching with no
    HBM is not a valid request (a cache needs bytes), so it is left out."""
    grid = itertools.product([False, True], [False, True], BUCKETS, OPTIMIZERS, HBM_RATIOS,
                             DIMS, TABLES)  # fmt: skip
    return [c for c in grid if not (c[0] and c[4] == 0.0)]


def combination_id(combo: tuple) -> str:
    caching, training, bucket, optimizer, ratio, dim, tables = combo
    bucket = "MAX" if bucket == MAX_BUCKET_CAPACITY else bucket
    rows = "+".join(map(str, tables))
    return (
        f"{'cache' if caching else 'nocache'}-{'train' if training else 'eval'}-b{bucket}-"
        f"{optimizer.name}-hbm{ratio}-d{dim}-n{rows}"
    )


def _build(combo: tuple, world_size: int):
    caching, training, bucket, optimizer, ratio, dim, tables = combo
    configs = [
        EmbeddingConfig(name=f"t{i}", embedding_dim=dim, num_embeddings=n, feature_names=[f"f{i}"])
        for i, n in enumerate(tables)
    ]
    user_options = {}
    for config in configs:
        value_bytes = get_table_value_bytes(config, optimizer, world_size, bucket)
        user_options[config.name] = DynamicEmbTableOptions(
            global_hbm_for_values=int(ratio * value_bytes),
            caching=caching,
            training=training,
            bucket_capacity=bucket,
            score_strategy=DynamicEmbScoreStrategy.TIMESTAMP,
            initializer_args=DynamicEmbInitializerArgs(
                mode=DynamicEmbInitializerMode.CONSTANT, value=0.1
            ),
        )
    module = EmbeddingCollection(tables=configs, device=torch.device("meta"))
    planner = get_planner(configs, set(), user_options, torch.device("cpu"))
    sharder = DynamicEmbeddingCollectionSharder(
        fused_params={"output_dtype": SparseType.FP32, "optimizer": optimizer,
                      "learning_rate": 1e-3},
        use_index_dedup=False,
    )  # fmt: skip
    plan = planner.collective_plan(module, [sharder], dist.GroupMember.WORLD)
    model = DistributedModelParallel(
        module=module, device=torch.device("cpu"), sharders=[sharder], plan=plan
    )
    return configs, user_options, model


def _check(combo: tuple, world_size: int) -> list[str]:
    """What disagrees with DynamicEmb's public behaviour (empty: the combination passes)."""
    caching, training, bucket, optimizer, ratio, dim, tables = combo
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        try:
            configs, user_options, model = _build(combo, world_size)
        except Exception as e:  # a refusal is the finding
            return [f"build: {type(e).__name__}: {e}"]
    problems = []
    for config in configs:
        o = user_options[config.name]
        want_cap = get_sharded_table_capacity(config, world_size, bucket)
        want_hbm = math.ceil(o.global_hbm_for_values / world_size)
        got = (o.max_capacity, o.local_hbm_for_values, o.dim)
        if got != (want_cap, want_hbm, config.embedding_dim) or o.embedding_dtype is None:
            problems.append(
                f"{config.name} options: (max_capacity, local_hbm_for_values, dim)={got}, "
                f"want {(want_cap, want_hbm, config.embedding_dim)}; "
                f"embedding_dtype={o.embedding_dtype}"
            )
    modules = [m for _, _, s in find_sharded_modules(model) for m in get_dynamic_emb_module(s)]
    if len(modules) != 1 or not isinstance(modules[0], BatchedDynamicEmbeddingTablesV2):
        return problems + [f"modules: {modules}"]
    if (modules[0].cache is not None) != caching:
        problems.append(f"cache: {modules[0].cache}, caching={caching}")
    # The tables work: one lookup of a few keys per feature.
    kjt = KeyedJaggedTensor(
        keys=[c.feature_names[0] for c in configs],
        values=torch.arange(3 * len(configs), dtype=torch.int64),
        lengths=torch.full((2 * len(configs),), 1, dtype=torch.int64).index_fill_(
            0, torch.arange(0, 2 * len(configs), 2), 2
        ),
    )
    out = model(kjt)
    for c in configs:
        values = out[c.feature_names[0]].values()
        if values.shape != (3, dim):
            problems.append(f"{c.name} lookup: {tuple(values.shape)}")
    return problems


def check_combinations(rank: int, world_size: int, combos: list[tuple]) -> dict:
    """{combination id: problems} for this rank."""
    return {combination_id(c): _check(c, world_size) for c in combos}
