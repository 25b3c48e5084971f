"""DYNAMICEMB_API.md section 3: DynamicEmbInitializerArgs defaults and the DEBUG rows."""

import dataclasses

import torch

from dynemb import DynamicEmbInitializerArgs, DynamicEmbInitializerMode, ScoredHashTable

M = DynamicEmbInitializerMode


def test_fields_and_defaults():
    fields = [(f.name, f.default) for f in dataclasses.fields(DynamicEmbInitializerArgs)]
    assert fields == [
        ("mode", M.UNIFORM),
        ("mean", 0.0),
        ("std_dev", 1.0),
        ("lower", None),
        ("upper", None),
        ("value", 0.0),
    ]


def test_debug_rows_are_key_mod_100000_as_unsigned():
    table = ScoredHashTable(
        dim=3, capacity=128, bucket_capacity=16, initializer=DynamicEmbInitializerArgs(mode=M.DEBUG)
    )
    keys = torch.tensor([0, 7, 99_999, 100_000, 123_456, 2**40 + 5, -1])
    rows = table.find_or_insert(keys)
    want = [float((k % 2**64) % 100_000) for k in keys.tolist()]
    assert want[-1] == float((2**64 - 1) % 100_000)  # -1 read as uint64: 51615
    assert rows.tolist() == [[w] * 3 for w in want]


def test_constant_rows():
    args = DynamicEmbInitializerArgs(mode=M.CONSTANT, value=0.25)
    table = ScoredHashTable(dim=2, capacity=128, bucket_capacity=16, initializer=args)
    assert table.find_or_insert(torch.tensor([5, 9])).tolist() == [[0.25, 0.25]] * 2


def test_equality_compares_the_fields_the_mode_reads():
    normal = DynamicEmbInitializerArgs(mode=M.NORMAL, mean=0.0, std_dev=0.1)
    assert normal == DynamicEmbInitializerArgs(mode=M.NORMAL, mean=0.0, std_dev=0.1, value=3.0)
    assert normal != DynamicEmbInitializerArgs(mode=M.NORMAL, mean=0.0, std_dev=0.2)
    uniform = DynamicEmbInitializerArgs(lower=-1.0, upper=1.0)
    assert uniform == DynamicEmbInitializerArgs(lower=-1.0, upper=1.0, mean=5.0)
    assert uniform != DynamicEmbInitializerArgs(lower=-1.0, upper=2.0)
    constant = DynamicEmbInitializerArgs(mode=M.CONSTANT, value=1.0)
    assert constant == DynamicEmbInitializerArgs(mode=M.CONSTANT, value=1.0, lower=0.0)
    assert constant != DynamicEmbInitializerArgs(mode=M.CONSTANT, value=2.0)
