"""DYNAMICEMB_API.md sections 9 and 13: dynemb.embedding_admission.MultiTableKVCounter,
DynamicEmb's counter over several tables addressed by (key, table id)."""

import pytest
import torch

from dynemb.embedding_admission import KVCounter, MultiTableKVCounter
from dynemb.types import MemoryType

CPU = torch.device("cpu")


def counter() -> MultiTableKVCounter:
    return MultiTableKVCounter([KVCounter(1024), KVCounter(2048, bucket_capacity=16)], CPU)


def test_counts_are_per_table():
    c = counter()
    assert c.add(torch.tensor([7, 7, 8]), torch.tensor([0, 1, 1])).tolist() == [1, 1, 1]
    got = c.add(torch.tensor([7, 7, 8]), torch.tensor([1, 1, 0]), torch.tensor([2, 3, 4]))
    assert got.tolist() == [6, 6, 4]


def test_erase_forgets_one_table_only():
    c = counter()
    c.add(torch.tensor([5, 5]), torch.tensor([0, 1]))
    c.erase(torch.tensor([5]), torch.tensor([0]))
    assert c.add(torch.tensor([5, 5]), torch.tensor([0, 1])).tolist() == [1, 2]


def test_memory_usage_by_memory_type():
    c = counter()
    c.add(torch.tensor([1]), torch.tensor([0]))
    assert c.memory_usage(MemoryType.HOST) > 0
    assert c.memory_usage(MemoryType.DEVICE) == 0  # CPU counters hold no device memory
    with pytest.raises(TypeError, match="`mem_type` must be a MemoryType, got 'host'"):
        c.memory_usage("host")


def test_dump_and_load_files(tmp_path):
    c = counter()
    c.add(torch.tensor([3, 4, 4, 9]), torch.tensor([1, 1, 1, 0]))
    c.dump(tmp_path / "keys", tmp_path / "counts", table_id=1)
    assert (tmp_path / "keys").stat().st_size == 2 * 8  # headerless int64
    fresh = counter()
    fresh.load(tmp_path / "keys", tmp_path / "counts", table_id=1)
    assert fresh.add(torch.tensor([3, 4, 9]), torch.tensor([1, 1, 1])).tolist() == [2, 3, 1]


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: MultiTableKVCounter([], CPU), "`kv_counters` must hold one KVCounter per table"),
        (lambda: counter().add(torch.tensor([1]), torch.tensor([2])), r"`table_ids` must be in \[0, 2\)"),
        (lambda: counter().add(torch.tensor([1, 2]), torch.tensor([0])), "`table_ids` must be a tensor of shape"),
        (lambda: counter().dump("k", "c", table_id=5), r"`table_id` must be an int in \[0, 2\), got 5"),
    ],
)  # fmt: skip
def test_bad_arguments_raise_value_error(call, message):
    with pytest.raises(ValueError, match=message):
        call()
