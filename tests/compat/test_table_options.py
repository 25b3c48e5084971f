"""DYNAMICEMB_API.md section 4: DynamicEmbTableOptions fields, defaults, normalisation."""

import dataclasses

import pytest
import torch

from dynemb import (
    DynamicEmbCheckMode,
    DynamicEmbEvictStrategy,
    DynamicEmbInitializerArgs,
    DynamicEmbInitializerMode,
    DynamicEmbScoreStrategy,
    DynamicEmbTableOptions,
)

pytestmark = pytest.mark.no_emulated_pass("option fields and defaults: Python only")

S = DynamicEmbScoreStrategy

DYNAMICEMB_FIELDS = [
    ("embedding_dtype", None),
    ("dim", None),
    ("max_capacity", None),
    ("evict_strategy", DynamicEmbEvictStrategy.LRU),
    ("local_hbm_for_values", 0),
    ("device_id", None),
    ("training", True),
    ("initializer_args", DynamicEmbInitializerArgs()),
    ("eval_initializer_args", None),  # CONSTANT 0.0, checked below
    ("caching", False),
    ("init_capacity", None),
    ("max_load_factor", 0.5),
    ("score_strategy", S.TIMESTAMP),
    ("bucket_capacity", 128),
    ("safe_check_mode", DynamicEmbCheckMode.IGNORE),
    ("global_hbm_for_values", 0),
    ("external_storage", None),
    ("index_type", None),
    ("dist_type", "roundrobin"),
    ("admit_strategy", None),
    ("admission_counter", None),
]


def test_fields_in_dynamicembs_order_with_its_defaults():
    options = DynamicEmbTableOptions()
    names = [f.name for f in dataclasses.fields(DynamicEmbTableOptions)]
    assert names[: len(DYNAMICEMB_FIELDS)] == [n for n, _ in DYNAMICEMB_FIELDS]
    extras = [
        "seed", "spill_directory", "score_half_life_steps", "column_offset", "warm_start",
        "eviction_rule", "stochastic_rounding", "hot_replicas", "hot_refresh_steps",
    ]  # fmt: skip
    # DynamicEmb's HierarchicalKV tuning fields (tests/compat/test_hkv_option_fields.py)
    hkv = ["block_size", "io_block_size", "io_by_cpu", "use_constant_memory"]
    hkv += ["reserved_key_start_bit", "num_of_buckets_per_alloc"]
    assert names[len(DYNAMICEMB_FIELDS) :] == extras + hkv  # after DynamicEmb's own
    for name, default in DYNAMICEMB_FIELDS:
        if name != "eval_initializer_args":
            assert getattr(options, name) == default, name
    evaluation = options.eval_initializer_args
    assert (evaluation.mode, evaluation.value) == (DynamicEmbInitializerMode.CONSTANT, 0.0)


def test_positional_construction_follows_dynamicembs_order():
    options = DynamicEmbTableOptions(torch.float16, 8, 1024)
    assert (options.embedding_dtype, options.dim, options.max_capacity) == (torch.float16, 8, 1024)


@pytest.mark.parametrize(
    "given, kept",
    [
        (None, None),
        ((S.LFU,), S.LFU),
        ((S.TIMESTAMP, S.LFU), (S.TIMESTAMP, S.LFU)),
        ((S.LFU, S.TIMESTAMP), (S.LFU, S.TIMESTAMP)),
        (S.STEP, S.STEP),
    ],
)
def test_score_strategy_normalisation(given, kept):
    assert DynamicEmbTableOptions(score_strategy=given).score_strategy == kept


def test_score_strategy_errors():
    with pytest.raises(NotImplementedError, match="TIMESTAMP, LFU"):
        DynamicEmbTableOptions(score_strategy=(S.STEP, S.LFU))
    with pytest.raises(TypeError, match="score_strategy"):
        DynamicEmbTableOptions(score_strategy="lfu")


def test_unknown_dist_type_raises():
    with pytest.raises(ValueError, match="dist_type.*'modulo'"):
        DynamicEmbTableOptions(dist_type="modulo")


def test_equality_and_hash_use_dynamicembs_grouping_fields():
    a = DynamicEmbTableOptions(dim=8, max_capacity=1024, bucket_capacity=64)
    b = DynamicEmbTableOptions(dim=16, max_capacity=2048)
    assert a == b and hash(a) == hash(b)  # dim / capacity / buckets are not compared
    assert a != DynamicEmbTableOptions(dim=8, caching=True)
    assert a != DynamicEmbTableOptions(dim=8, dist_type="continuous")
    assert a != DynamicEmbTableOptions(dim=8, score_strategy=S.LFU)
    assert len({a, b, DynamicEmbTableOptions(training=False)}) == 2
