"""DynamicEmb's HierarchicalKV tuning fields of DynamicEmbTableOptions (``block_size``,
``io_block_size``, ``io_by_cpu``, ``use_constant_memory``, ``reserved_key_start_bit``,
``num_of_buckets_per_alloc``; DynamicEmb's own incremental-dump tests set the last):
accepted with DynamicEmb's defaults, and without effect: a table built with them
trains exactly as one built without (the oracle)."""

import pytest
import torch

from dynemb import DynamicEmbTableOptions
from dynemb.batched_dynamicemb_tables import BatchedDynamicEmbeddingTablesV2

pytestmark = pytest.mark.no_emulated_pass("option fields: Python only")

HKV = {
    "block_size": 128,
    "io_block_size": 1024,
    "io_by_cpu": False,
    "use_constant_memory": False,
    "reserved_key_start_bit": 0,
    "num_of_buckets_per_alloc": 1,
}


def test_defaults_are_dynamicembs():
    options = DynamicEmbTableOptions()
    assert {name: getattr(options, name) for name in HKV} == HKV


def test_setting_them_changes_nothing():
    tuned = {
        "block_size": 64, "io_block_size": 4096, "io_by_cpu": True,
        "use_constant_memory": True, "reserved_key_start_bit": 2,
        "num_of_buckets_per_alloc": 32,
    }  # fmt: skip
    plain = BatchedDynamicEmbeddingTablesV2([DynamicEmbTableOptions(dim=4, max_capacity=4096)])
    tuned_tables = BatchedDynamicEmbeddingTablesV2(
        [DynamicEmbTableOptions(dim=4, max_capacity=4096, **tuned)]
    )
    keys = torch.randint(0, 1 << 40, (64,), generator=torch.Generator().manual_seed(1))
    for _ in range(3):
        want, got = plain(keys, torch.arange(65)), tuned_tables(keys, torch.arange(65))
        assert torch.equal(want, got)
        want.sum().backward()
        got.sum().backward()
    assert torch.equal(plain.tables[0].find(keys)[0], tuned_tables.tables[0].find(keys)[0])
