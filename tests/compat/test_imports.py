"""DYNAMICEMB_API.md section 1: every DynamicEmb name imports from the same path in dynemb."""

import importlib

import pytest

pytestmark = pytest.mark.no_emulated_pass("import paths: Python only")

TOP_LEVEL = [
    "AdmissionStrategy",
    "Counter",
    "KVCounter",
    "FrequencyAdmissionStrategy",
    "BUCKET_ALIGNMENT",
    "DEMB_TABLE_ALIGN_SIZE",
    "MAX_BUCKET_CAPACITY",
    "BATCH_SIZE_PER_DUMP",
    "align_to_table_size",
    "get_table_value_bytes",
    "get_sharded_table_capacity",
    "DynamicEmbCheckMode",
    "DynamicEmbInitializerArgs",
    "DynamicEmbInitializerMode",
    "DynamicEmbTableOptions",
    "DynamicEmbPoolingMode",
    "DynamicEmbEvictStrategy",
    "DynamicEmbScoreStrategy",
    "ScoreStrategy",
    "data_type_to_dyn_emb",
    "data_type_to_dtype",
    "dyn_emb_to_torch",
    "torch_to_dyn_emb",
    "string_to_evict_strategy",
    "DynamicEmbDump",
    "DynamicEmbLoad",
    "EmbOptimType",
    "OptimizerArgs",
]

SUBMODULE = [
    ("dynemb.planner", "DynamicEmbeddingEnumerator"),
    ("dynemb.planner", "DynamicEmbeddingShardingPlanner"),
    ("dynemb.planner", "DynamicEmbParameterConstraints"),
    ("dynemb.planner", "DynamicEmbParameterSharding"),
    ("dynemb.shard", "DynamicEmbeddingBagCollectionSharder"),
    ("dynemb.shard", "DynamicEmbeddingCollectionSharder"),
    ("dynemb.shard", "ShardedDynamicEmbeddingBagCollection"),
    ("dynemb.shard", "ShardedDynamicEmbeddingCollection"),
    ("dynemb.incremental_dump", "get_score"),
    ("dynemb.incremental_dump", "set_score"),
    ("dynemb.incremental_dump", "incremental_dump"),
    ("dynemb.batched_dynamicemb_tables", "BatchedDynamicEmbeddingTablesV2"),
    ("dynemb.types", "MemoryType"),
    ("dynemb.dynamicemb_config", "ScoreStrategy"),
    ("dynemb.dynamicemb_config", "DynamicEmbTableOptions"),
    ("dynemb.optimizer", "EmbOptimType"),
    ("dynemb.inference.exportable_tables", "InferenceEmbeddingCollection"),
]


@pytest.mark.parametrize("name", TOP_LEVEL)
def test_top_level_name_is_exported(name):
    dynemb = importlib.import_module("dynemb")
    assert name in dynemb.__all__
    assert getattr(dynemb, name) is not None


@pytest.mark.parametrize("module, name", SUBMODULE)
def test_submodule_name_imports(module, name):
    assert getattr(importlib.import_module(module), name) is not None


def test_top_level_and_submodule_objects_are_the_same():
    import dynemb
    import dynemb.optimizer
    import dynemb.planner

    assert dynemb.get_table_value_bytes is dynemb.planner.get_table_value_bytes
    assert dynemb.get_sharded_table_capacity is dynemb.planner.get_sharded_table_capacity
    assert dynemb.EmbOptimType is dynemb.optimizer.EmbOptimType


def test_emb_optim_type_is_fbgemms_enum():
    from fbgemm_gpu.split_embedding_configs import EmbOptimType as Fbgemm

    import dynemb

    assert dynemb.EmbOptimType is Fbgemm
    assert dynemb.EmbOptimType.EXACT_ROWWISE_ADAGRAD.value == "exact_row_wise_adagrad"


def test_inference_embedding_collection_signatures():
    """DYNAMICEMB_API.md section 11: the constructor, load and forward arguments, in order;
    dynemb's own keyword (``weights_dtype``, 8-bit rows) only after DynamicEmb's."""
    import inspect

    from dynemb.inference.exportable_tables import InferenceEmbeddingCollection as IEC

    def params(f):
        return list(inspect.signature(f).parameters)[1:]

    assert params(IEC.__init__) == [
        "table_options", "use_dynamic_hash", "pooling_mode", "table_names", "feature_names",
        "feature_table_map", "output_dtype", "device", "key_type", "weights_dtype",
    ]  # fmt: skip
    assert inspect.signature(IEC.__init__).parameters["weights_dtype"].default is None
    assert params(IEC.load_from_dynamicemb_file)[:2] == ["save_dir", "table_names"]
    assert params(IEC.forward) == ["keys", "offsets", "pooling_offsets", "per_sample_weights"]
