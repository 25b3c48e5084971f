"""DYNAMICEMB_API.md section 13: every module path a DynamicEmb user imports from resolves
in dynemb to the same object as dynemb's own, with DynamicEmb's values."""

import abc
import importlib

import pytest
import torch
from torchrec import EmbeddingBagCollection, EmbeddingCollection

import dynemb
from dynemb.admission_strategies import AdmissionStrategy, Counter
from dynemb.tiering import Cache, CachedTable, Storage

pytestmark = pytest.mark.no_emulated_pass("module paths: Python only")

# (module, name, the dynemb object it must be)
SAME_OBJECT = [
    ("dynemb.dump_load", "DynamicEmbDump", dynemb.DynamicEmbDump),
    ("dynemb.dump_load", "DynamicEmbLoad", dynemb.DynamicEmbLoad),
    ("dynemb.embedding_admission", "KVCounter", dynemb.KVCounter),
    ("dynemb.embedding_admission", "FrequencyAdmissionStrategy", dynemb.FrequencyAdmissionStrategy),
    ("dynemb.types", "MemoryType", importlib.import_module("dynemb.types").MemoryType),
    ("dynemb.types", "DynamicEmbInitializerMode", dynemb.DynamicEmbInitializerMode),
    ("dynemb.types", "DynamicEmbInitializerArgs", dynemb.DynamicEmbInitializerArgs),
    ("dynemb.types", "DEMB_TABLE_ALIGN_SIZE", dynemb.DEMB_TABLE_ALIGN_SIZE),
    ("dynemb.types", "BUCKET_ALIGNMENT", dynemb.BUCKET_ALIGNMENT),
    ("dynemb.types", "MAX_BUCKET_CAPACITY", dynemb.MAX_BUCKET_CAPACITY),
    ("dynemb.types", "Storage", Storage),
    ("dynemb.types", "Cache", Cache),
    ("dynemb.types", "Counter", Counter),
    ("dynemb.types", "AdmissionStrategy", AdmissionStrategy),
    ("dynemb.dynamicemb_config", "BATCH_SIZE_PER_DUMP", dynemb.BATCH_SIZE_PER_DUMP),
    ("dynemb.dynamicemb_config", "DynamicEmbCheckMode", dynemb.DynamicEmbCheckMode),
    ("dynemb.dynamicemb_config", "DynamicEmbPoolingMode", dynemb.DynamicEmbPoolingMode),
    ("dynemb.dynamicemb_config", "DynamicEmbEvictStrategy", dynemb.DynamicEmbEvictStrategy),
    ("dynemb.dynamicemb_config", "DynamicEmbScoreStrategy", dynemb.DynamicEmbScoreStrategy),
    ("dynemb.dynamicemb_config", "DynamicEmbTableOptions", dynemb.DynamicEmbTableOptions),
    # DynamicEmb's module imports these from its types; its own tests take them from here.
    ("dynemb.dynamicemb_config", "DynamicEmbInitializerMode", dynemb.DynamicEmbInitializerMode),
    ("dynemb.dynamicemb_config", "DynamicEmbInitializerArgs", dynemb.DynamicEmbInitializerArgs),
    ("dynemb.dynamicemb_config", "get_table_value_bytes", dynemb.get_table_value_bytes),
    ("dynemb.dynamicemb_config", "get_sharded_table_capacity", dynemb.get_sharded_table_capacity),
    ("dynemb.dynamicemb_config", "align_to_table_size", dynemb.align_to_table_size),
    ("dynemb.dynamicemb_config", "data_type_to_dtype", dynemb.data_type_to_dtype),
    ("dynemb.dynamicemb_config", "data_type_to_dyn_emb", dynemb.data_type_to_dyn_emb),
    ("dynemb.dynamicemb_config", "dyn_emb_to_torch", dynemb.dyn_emb_to_torch),
    ("dynemb.dynamicemb_config", "string_to_evict_strategy", dynemb.string_to_evict_strategy),
    ("dynemb.utils", "torch_to_dyn_emb", dynemb.torch_to_dyn_emb),
]

# Names with no top-level twin: they must import and be listed in the module's __all__.
OWN_NAMES = [
    ("dynemb.dump_load", ["find_sharded_modules", "get_dynamic_emb_module"]),
    ("dynemb.get_planner", ["get_planner"]),
    ("dynemb.embedding_admission", ["MultiTableKVCounter"]),
    ("dynemb.types", ["KEY_TYPE", "EMBEDDING_TYPE", "SCORE_TYPE", "OPT_STATE_TYPE",
                      "COUNTER_TYPE", "CopyMode"]),
    ("dynemb.dynamicemb_config", ["SUPPORTED_DIST_TYPES", "DEFAULT_BUCKET_CAPACITY",
                                  "normalize_score_strategy",
                                  "score_strategy_has_timestamp_column", "dtype_to_bytes"]),
    ("dynemb.utils", ["TORCHREC_TYPES", "DTYPE_NUM_BYTES"]),
]  # fmt: skip


@pytest.mark.parametrize("module, name, expected", SAME_OBJECT)
def test_path_resolves_to_dynembs_object(module, name, expected):
    mod = importlib.import_module(module)
    assert getattr(mod, name) is expected
    assert name in mod.__all__
    namespace = {}
    exec(f"from {module} import {name}", namespace)  # the user's spelling
    assert namespace[name] is expected


@pytest.mark.parametrize("module, names", OWN_NAMES)
def test_own_names_import_and_are_exported(module, names):
    mod = importlib.import_module(module)
    for name in names:
        assert getattr(mod, name) is not None
        assert name in mod.__all__


def test_star_import_of_types_and_config():
    for module in ("dynemb.types", "dynemb.dynamicemb_config"):
        namespace = {}
        exec(f"from {module} import *", namespace)
        assert set(importlib.import_module(module).__all__) <= set(namespace)


def test_unknown_name_raises_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'NOPE'"):
        importlib.import_module("dynemb.types").NOPE  # noqa: B018


def test_types_constants_have_dynamicembs_values():
    from dynemb.types import (
        BUCKET_ALIGNMENT,
        COUNTER_TYPE,
        DEMB_TABLE_ALIGN_SIZE,
        EMBEDDING_TYPE,
        KEY_TYPE,
        MAX_BUCKET_CAPACITY,
        OPT_STATE_TYPE,
        SCORE_TYPE,
        CopyMode,
    )

    assert (KEY_TYPE, EMBEDDING_TYPE, SCORE_TYPE, OPT_STATE_TYPE, COUNTER_TYPE) == (
        torch.int64, torch.float32, torch.int64, torch.float32, torch.int64,
    )  # fmt: skip
    assert DEMB_TABLE_ALIGN_SIZE == BUCKET_ALIGNMENT == 16
    assert MAX_BUCKET_CAPACITY == 2**63 - 1
    assert {m.name for m in CopyMode} == {"EMBEDDING", "VALUE"}


def test_abstract_classes_are_abstract_and_caches_implement_cache():
    from dynemb.types import AdmissionStrategy, Cache, Counter, Storage

    for cls in (Storage, Cache, Counter, AdmissionStrategy):
        assert isinstance(cls, abc.ABCMeta) and cls.__abstractmethods__
        with pytest.raises(TypeError):
            cls()
    assert issubclass(CachedTable, Cache)


def test_dynamicemb_config_values():
    from dynemb.dynamicemb_config import (
        BATCH_SIZE_PER_DUMP,
        DEFAULT_BUCKET_CAPACITY,
        SUPPORTED_DIST_TYPES,
        DynamicEmbTableOptions,
    )

    assert BATCH_SIZE_PER_DUMP == 65536
    assert DEFAULT_BUCKET_CAPACITY == 128 == DynamicEmbTableOptions().bucket_capacity
    assert set(SUPPORTED_DIST_TYPES) == {"continuous", "roundrobin", "hash_roundrobin"}


def test_normalize_score_strategy():
    from dynemb.dynamicemb_config import DynamicEmbScoreStrategy as S
    from dynemb.dynamicemb_config import normalize_score_strategy

    assert normalize_score_strategy(None) is None
    assert normalize_score_strategy((S.LFU,)) is S.LFU
    assert normalize_score_strategy((S.LFU, S.TIMESTAMP)) == (S.LFU, S.TIMESTAMP)
    with pytest.raises(NotImplementedError, match="STEP"):
        normalize_score_strategy((S.STEP, S.LFU))
    with pytest.raises(TypeError, match="'lfu'"):
        normalize_score_strategy("lfu")


@pytest.mark.parametrize(
    "strategy, expected",
    [("TIMESTAMP", True), ("STEP", False), ("CUSTOMIZED", False), ("LFU", False),
     ("NO_EVICTION", False), (("TIMESTAMP", "LFU"), True), (("LFU", "TIMESTAMP"), True)],
)  # fmt: skip
def test_score_strategy_has_timestamp_column(strategy, expected):
    from dynemb.dynamicemb_config import DynamicEmbScoreStrategy as S
    from dynemb.dynamicemb_config import score_strategy_has_timestamp_column

    value = tuple(S[s] for s in strategy) if isinstance(strategy, tuple) else S[strategy]
    assert score_strategy_has_timestamp_column(value) is expected


def test_dtype_to_bytes_and_dtype_num_bytes():
    from dynemb.dynamicemb_config import dtype_to_bytes
    from dynemb.utils import DTYPE_NUM_BYTES

    for dtype, n in [(torch.float32, 4), (torch.float16, 2), (torch.bfloat16, 2),
                     (torch.int64, 8), (torch.int32, 4)]:  # fmt: skip
        assert dtype_to_bytes(dtype) == DTYPE_NUM_BYTES[dtype] == n
    with pytest.raises(TypeError, match="`dtype` must be a torch.dtype, got 'float32'"):
        dtype_to_bytes("float32")


def test_torchrec_types():
    from dynemb.utils import TORCHREC_TYPES

    assert TORCHREC_TYPES == {EmbeddingBagCollection, EmbeddingCollection}


def test_sizing_helpers_by_their_config_path():
    from torchrec import EmbeddingConfig

    from dynemb.dynamicemb_config import (
        align_to_table_size,
        get_sharded_table_capacity,
        get_table_value_bytes,
    )
    from dynemb.optimizer import EmbOptimType

    cfg = EmbeddingConfig(name="t", embedding_dim=8, num_embeddings=100, feature_names=["f"])
    assert get_sharded_table_capacity(cfg, 2, 128) == 128
    assert get_table_value_bytes(cfg, EmbOptimType.SGD, 2, 128) == 4 * 8 * 128 * 2
    assert align_to_table_size(0) == 16 and align_to_table_size(17) == 32


def test_submodule_paths_are_attributes_after_import_dynemb():
    """``import dynemb`` alone makes DynamicEmb's submodule paths attributes (a fresh
    interpreter: another test's import would hide a missing one)."""
    import subprocess
    import sys

    code = "import dynemb\nfor m in ('batched_dynamicemb_tables', 'optimizer', 'shard', 'planner'):\n    getattr(dynemb, m)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
