"""DynamicEmb's newest admission API: the counter goes on the strategy,
``FrequencyAdmissionStrategy(threshold, counter=KVCounter(...))``, and the table option
``admission_counter`` is deprecated: it warns and is folded into a copy of the strategy
(per table, the caller's strategy untouched). Both forms admit the same keys and write
the same checkpoint files."""

import filecmp
import warnings
from pathlib import Path

import pytest
import torch

from dynemb import (
    DynamicEmbInitializerArgs,
    DynamicEmbInitializerMode,
    DynamicEmbTableOptions,
    FrequencyAdmissionStrategy,
    KVCounter,
)
from dynemb.batched_dynamicemb_tables import BatchedDynamicEmbeddingTablesV2


def test_old_form_warns_and_reaches_a_copy_of_the_strategy():
    counter = KVCounter(capacity=1024)
    strategy = FrequencyAdmissionStrategy(threshold=4)
    with pytest.warns(DeprecationWarning, match="admission_counter"):
        options = DynamicEmbTableOptions(admit_strategy=strategy, admission_counter=counter)
    assert options.admit_strategy.counter is counter
    assert options.admit_strategy.threshold == 4
    assert strategy.counter is None  # the caller's object is unchanged


def test_one_strategy_for_several_tables_keeps_each_tables_counter():
    shared = FrequencyAdmissionStrategy(threshold=4)
    with pytest.warns(DeprecationWarning):
        small = DynamicEmbTableOptions(admit_strategy=shared, admission_counter=KVCounter(1024))
        large = DynamicEmbTableOptions(admit_strategy=shared, admission_counter=KVCounter(4096))
    assert (small.admit_strategy.counter.capacity, large.admit_strategy.counter.capacity) == (
        1024,
        4096,
    )
    assert shared.counter is None


def test_a_strategy_with_its_own_counter_keeps_it():
    own = KVCounter(capacity=1024)
    strategy = FrequencyAdmissionStrategy(threshold=4, counter=own)
    with pytest.warns(DeprecationWarning, match="ignored"):
        options = DynamicEmbTableOptions(admit_strategy=strategy, admission_counter=KVCounter(4096))
    assert options.admit_strategy is strategy and strategy.counter is own


def test_new_form_does_not_warn_nor_do_copies_of_folded_options():
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        DynamicEmbTableOptions(
            admit_strategy=FrequencyAdmissionStrategy(threshold=4, counter=KVCounter(1024))
        )
    with pytest.warns(DeprecationWarning):
        folded = DynamicEmbTableOptions(
            admit_strategy=FrequencyAdmissionStrategy(4), admission_counter=KVCounter(1024)
        )
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        import dataclasses

        dataclasses.replace(folded, dim=8)  # no second warning, no second fold


def test_strategies_compare_by_value():
    a = FrequencyAdmissionStrategy(3, counter=KVCounter(1024, bucket_capacity=128))
    b = FrequencyAdmissionStrategy(3, counter=KVCounter(4096, bucket_capacity=128))
    assert a == b and hash(a) == hash(b)  # the capacity is per table, not a group key
    assert a != FrequencyAdmissionStrategy(4, counter=KVCounter(1024, bucket_capacity=128))
    assert a != FrequencyAdmissionStrategy(3, counter=KVCounter(1024, bucket_capacity=256))


def test_counter_must_be_a_counter():
    with pytest.raises(TypeError, match="counter must be a Counter"):
        FrequencyAdmissionStrategy(3, counter={"capacity": 1024})


def _train(old_form: bool, directory: Path) -> BatchedDynamicEmbeddingTablesV2:
    zero = DynamicEmbInitializerArgs(mode=DynamicEmbInitializerMode.CONSTANT, value=0.0)
    if old_form:
        with pytest.warns(DeprecationWarning):
            options = DynamicEmbTableOptions(
                dim=4, max_capacity=1024, initializer_args=zero,
                admit_strategy=FrequencyAdmissionStrategy(3),
                admission_counter=KVCounter(256, bucket_capacity=16),
            )  # fmt: skip
    else:
        options = DynamicEmbTableOptions(
            dim=4, max_capacity=1024, initializer_args=zero,
            admit_strategy=FrequencyAdmissionStrategy(
                3, counter=KVCounter(256, bucket_capacity=16)
            ),
        )  # fmt: skip
    m = BatchedDynamicEmbeddingTablesV2([options], table_names=["t"])
    g = torch.Generator().manual_seed(7)
    for _ in range(6):
        keys = torch.randint(0, 40, (32,), generator=g)
        m(keys, torch.arange(33)).sum().backward()
    m.dump(str(directory), optim=True, counter=True, format="dynamicemb")
    return m


def test_both_forms_admit_the_same_keys_and_write_the_same_files(tmp_path):
    old = _train(True, tmp_path / "old")
    new = _train(False, tmp_path / "new")
    probe = torch.arange(40)
    assert torch.equal(old.tables[0].contains(probe), new.tables[0].contains(probe))
    assert 0 < int(new.tables[0].contains(probe).sum()) < 40  # some admitted, some not
    old_files = sorted(p.relative_to(tmp_path / "old") for p in (tmp_path / "old").rglob("*"))
    new_files = sorted(p.relative_to(tmp_path / "new") for p in (tmp_path / "new").rglob("*"))
    assert old_files == new_files and any("counter" in str(p) for p in new_files)
    for rel in new_files:
        if (tmp_path / "new" / rel).is_file() and "score" not in str(rel):
            assert filecmp.cmp(tmp_path / "old" / rel, tmp_path / "new" / rel, shallow=False), rel
