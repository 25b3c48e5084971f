"""DYNAMICEMB_API.md section 2: constants, enum bases and values."""

import enum

import pytest

import dynemb
from dynemb.types import EvictStrategy, MemoryType

pytestmark = pytest.mark.no_emulated_pass("constants and enums: Python only")


def test_constants():
    assert dynemb.BUCKET_ALIGNMENT == 16
    assert dynemb.DEMB_TABLE_ALIGN_SIZE == 16
    assert dynemb.MAX_BUCKET_CAPACITY == 2**63 - 1
    assert dynemb.BATCH_SIZE_PER_DUMP == 65536


@pytest.mark.parametrize(
    "cls, members",
    [
        (dynemb.DynamicEmbCheckMode, {"ERROR": 0, "WARNING": 1, "IGNORE": 2}),
        (dynemb.DynamicEmbPoolingMode, {"SUM": 0, "MEAN": 1, "NONE": 2}),
        (
            dynemb.DynamicEmbScoreStrategy,
            # DynamicEmb's members and values, and dynemb's DECAYED_LFU (the core's code).
            {"TIMESTAMP": 0, "STEP": 1, "CUSTOMIZED": 2, "LFU": 3, "NO_EVICTION": 4}
            | {"DECAYED_LFU": 7},
        ),
    ],
)
def test_int_enums(cls, members):
    assert issubclass(cls, enum.IntEnum)
    assert {m.name: m.value for m in cls} == members
    for name, value in members.items():
        assert cls[name] == value  # compares equal to its int, as in DynamicEmb


def test_initializer_mode_is_a_plain_enum_of_strings():
    mode = dynemb.DynamicEmbInitializerMode
    assert not issubclass(mode, (int, str))
    assert {m.name: m.value for m in mode} == {
        "NORMAL": "normal",
        "TRUNCATED_NORMAL": "truncated_normal",
        "UNIFORM": "uniform",
        "CONSTANT": "constant",
        "DEBUG": "debug",
    }
    assert mode("uniform") is mode.UNIFORM


def test_evict_strategy_values_are_the_policy_codes():
    evict = dynemb.DynamicEmbEvictStrategy
    assert not issubclass(evict, int)
    assert [m.name for m in evict] == ["LRU", "LFU", "EPOCH_LRU", "EPOCH_LFU", "CUSTOMIZED"]
    assert [m.value for m in evict] == [
        EvictStrategy.KLru,
        EvictStrategy.KLfu,
        EvictStrategy.KEpochLru,
        EvictStrategy.KEpochLfu,
        EvictStrategy.KCustomized,
    ]
    assert [m.value.value for m in evict] == [0, 1, 2, 3, 4]
    assert str(evict.LRU.value) == "EvictStrategy.KLru"  # the spelling of checkpoints


def test_memory_type():
    assert {m.name: m.value for m in MemoryType} == {
        "DEVICE": "device",
        "MANAGED": "managed",
        "PINNED_HOST": "pinned_host",
        "HOST": "host",
    }


def test_score_strategy_is_a_typing_alias_of_a_strategy_or_a_tuple():
    import typing

    from dynemb.dynamicemb_config import ScoreStrategy

    assert ScoreStrategy is dynemb.ScoreStrategy
    single, many = typing.get_args(ScoreStrategy)
    assert single is dynemb.DynamicEmbScoreStrategy
    assert typing.get_origin(many) is tuple
