"""Admission: KVCounter counts exactly and forgets the least counted keys; a table with
FrequencyAdmissionStrategy stores a key only once it has been seen `threshold` times,
trains admitted keys like a table without admission, and eval mode changes nothing."""

import pytest
import torch

from dynemb import (
    BatchedDynamicEmbeddingTables,
    DynamicEmbInitializerArgs,
    DynamicEmbInitializerMode,
    DynamicEmbPoolingMode,
    DynamicEmbTableOptions,
)
from dynemb.admission_strategies import Counter, FrequencyAdmissionStrategy, KVCounter
from dynemb.optimizer import EmbOptimType

DEBUG = DynamicEmbInitializerArgs(mode=DynamicEmbInitializerMode.DEBUG)  # row = float(key)
MINUS_ONE = DynamicEmbInitializerArgs(mode=DynamicEmbInitializerMode.CONSTANT, value=-1.0)


def counts_of(counter: Counter) -> dict:
    keys, counts = counter.dump()
    return dict(zip(keys.tolist(), counts.tolist()))


def make(threshold=3, admission_init=None, initializer=DEBUG, admission=True, **kw):
    opts = DynamicEmbTableOptions(
        dim=4, max_capacity=256, bucket_capacity=16, initializer_args=initializer,
        admit_strategy=FrequencyAdmissionStrategy(
            threshold, admission_init, counter=KVCounter(capacity=64, bucket_capacity=16)
        ) if admission else None,
    )  # fmt: skip
    return BatchedDynamicEmbeddingTables(
        [opts], feature_table_map=[0], pooling_mode=DynamicEmbPoolingMode.SUM,
        optimizer=kw.pop("optimizer", EmbOptimType.EXACT_SGD), learning_rate=0.5, **kw,
    )  # fmt: skip


def bags(*keys_per_bag):
    """One feature: indices and offsets of the given bags."""
    lengths = torch.tensor([len(b) for b in keys_per_bag])
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(lengths, 0)])
    return torch.tensor([k for b in keys_per_bag for k in b], dtype=torch.int64), offsets


def stored(m) -> dict:
    t = m.tables[0]
    keys, values, _, _ = t.export_batch(0, t.capacity(), include_extra=True)
    return {k: v for k, v in zip(keys.tolist(), values)}


# ------------------------------------------------------------------ KVCounter


def test_counter_counts_repeats_frequencies_and_erase():
    c = KVCounter(capacity=64, bucket_capacity=16)
    assert c.add(torch.tensor([7, 8, 7])).tolist() == [2, 1, 2]  # repeats within a call
    assert c.add(torch.tensor([8, 9]), torch.tensor([5, 0])).tolist() == [6, 0]
    assert c.add(torch.tensor([7])).tolist() == [3]
    assert counts_of(c) == {7: 3, 8: 6, 9: 0}
    c.erase(torch.tensor([8, 123]))  # an absent key is ignored
    assert counts_of(c) == {7: 3, 9: 0}
    assert c.add(torch.tensor([8])).tolist() == [1]  # erased: counts again from 0
    assert c.add(torch.tensor([], dtype=torch.int64)).numel() == 0


def test_counter_dump_load_round_trip_into_a_created_counter():
    c = KVCounter(capacity=64, bucket_capacity=16)
    c.add(torch.arange(20), torch.arange(20) % 7 + 1)
    keys, counts = c.dump()
    copy = c.create()
    assert isinstance(copy, KVCounter) and counts_of(copy) == {}  # create: empty, same config
    assert copy.memory_usage() == c.memory_usage() > 0
    copy.load(keys, counts)
    assert counts_of(copy) == counts_of(c) == {k: k % 7 + 1 for k in range(20)}
    assert copy.add(torch.tensor([6])).tolist() == [7 + 1]
    with pytest.raises(ValueError, match="distinct"):
        copy.load(torch.tensor([1, 1]), torch.tensor([2, 3]))


def test_full_counter_forgets_the_least_counted_key():
    c = KVCounter(capacity=16, bucket_capacity=16)  # one bucket of 16 slots
    c.add(torch.arange(100, 116), torch.arange(1, 17))  # key 100 + i counted i + 1
    assert c.add(torch.tensor([5]), torch.tensor([4])).tolist() == [4]
    assert 100 not in counts_of(c) and counts_of(c)[5] == 4  # count 1 evicted
    assert len(counts_of(c)) == 16
    # A newcomer counted below every resident (min is now 2) is not remembered.
    assert c.add(torch.tensor([6])).tolist() == [1]
    assert 6 not in counts_of(c) and counts_of(c)[101] == 2


def test_counter_and_strategy_errors():
    with pytest.raises(ValueError, match="key_type"):
        KVCounter(capacity=64, key_type=torch.int32)
    with pytest.raises(ValueError, match="capacity must be a positive int, got 0"):
        KVCounter(capacity=0)
    with pytest.raises(ValueError, match="bucket_capacity must be a positive int, got -16"):
        KVCounter(capacity=64, bucket_capacity=-16)
    c = KVCounter(capacity=64, bucket_capacity=16)
    with pytest.raises(ValueError, match="frequency must be >= 0"):
        c.add(torch.tensor([1]), torch.tensor([-1]))
    with pytest.raises(TypeError, match="keys"):
        c.add(torch.tensor([1.0]))
    assert counts_of(c) == {}  # rejected before any change
    with pytest.raises(ValueError, match="threshold must be >= 0, got -1"):
        FrequencyAdmissionStrategy(-1)
    with pytest.raises(TypeError, match="threshold"):
        FrequencyAdmissionStrategy(2.5)
    with pytest.raises(TypeError, match="initializer_args"):
        FrequencyAdmissionStrategy(2, initializer_args="zeros")


# ------------------------------------------------------- tables with admission


def test_keys_are_stored_once_seen_threshold_times():
    m = make(threshold=3)
    m(*bags([1, 1], [2])).sum().backward()  # 1 seen twice, 2 once
    assert stored(m) == {} and counts_of(m.admission_counters[0]) == {1: 2, 2: 1}
    m(*bags([1], [3, 3, 3])).sum().backward()  # 1: third time (across batches); 3: within
    assert sorted(stored(m)) == [1, 3]
    assert counts_of(m.admission_counters[0]) == {2: 1}  # admitted keys leave the counter
    # The batch that admits a key trains it: DEBUG row (= key) minus lr * occurrences.
    assert stored(m)[1][:4].tolist() == [1.0 - 0.5] * 4
    assert stored(m)[3][:4].tolist() == [3.0 - 0.5 * 3] * 4
    m(*bags([1, 2], [4])).sum().backward()  # stored keys are not counted again
    assert sorted(stored(m)) == [1, 3]
    assert counts_of(m.admission_counters[0]) == {2: 2, 4: 1}


@pytest.mark.parametrize("admission_init, row", [(None, 5.0), (MINUS_ONE, -1.0)])
def test_not_admitted_keys_get_the_admission_initializer_row(admission_init, row):
    m = make(threshold=2, admission_init=admission_init)
    out = m(*bags([5], [6, 6]))  # 6 is admitted in this batch, 5 is not
    assert out.tolist() == [[row] * 4, [12.0] * 4]
    out.sum().backward()  # the gradient of key 5 is dropped
    assert sorted(stored(m)) == [6]
    out = m(*bags([5], []))  # 5: second sight, admitted, stored with the table's initializer
    assert out.tolist() == [[5.0] * 4, [0.0] * 4]


def test_admitted_keys_train_like_a_table_without_admission():
    uniform = DynamicEmbInitializerArgs(mode=DynamicEmbInitializerMode.UNIFORM)
    kw = dict(initializer=uniform, optimizer=EmbOptimType.EXACT_ADAGRAD)
    a, b = make(threshold=2, **kw), make(admission=False, **kw)
    a(*bags([1], [2], [9])).sum().backward()  # counts only: nothing stored
    assert stored(a) == {}
    batches = [([1, 1], [2, 2], []), ([1], [2], [9]), ([2, 1], [1], [2])]
    for batch in batches:
        # b never sees key 9; a admits it at step 1 (its second sight) and trains it.
        plain = tuple([x for x in bag if x != 9] for bag in batch)
        out_a, out_b = a(*bags(*batch)), b(*bags(*plain))
        if 9 not in sum(batch, []):
            assert torch.equal(out_a, out_b)
        else:
            assert torch.equal(out_a[:2], out_b[:2]) and not torch.equal(out_a[2], out_b[2])
        (out_a**2).sum().backward()
        (out_b**2).sum().backward()
    rows_a, rows_b = stored(a), stored(b)
    assert sorted(rows_a) == [1, 2, 9] and sorted(rows_b) == [1, 2]
    for key in (1, 2):  # rows and Adagrad state
        assert torch.equal(rows_a[key], rows_b[key])


def test_eval_mode_neither_counts_nor_inserts():
    m = make(threshold=2)
    m(*bags([1, 1], [2])).sum().backward()
    before_rows, before_counts = stored(m), counts_of(m.admission_counters[0])
    m.eval()
    out = m(*bags([2, 2, 2], [7]))
    assert out.tolist() == [[0.0] * 4, [0.0] * 4]  # unknown keys: eval initializer (zeros)
    assert counts_of(m.admission_counters[0]) == before_counts == {2: 1}
    assert sorted(stored(m)) == sorted(before_rows) == [1]
    m.train()
    m(*bags([2], [])).sum().backward()  # counting resumes in training
    assert sorted(stored(m)) == [1, 2]


def test_tables_sharing_a_counter_template_count_separately():
    template = KVCounter(capacity=64, bucket_capacity=16)
    opts = DynamicEmbTableOptions(
        dim=4, max_capacity=256, bucket_capacity=16,
        admit_strategy=FrequencyAdmissionStrategy(5, counter=template),
    )  # fmt: skip
    m = BatchedDynamicEmbeddingTables([opts, opts], feature_table_map=[0, 1])
    m(*bags([3], [], [], [4]))  # feature 0: key 3 (table 0); feature 1: key 4 (table 1)
    assert m.admission_counters[0] is not m.admission_counters[1]
    assert counts_of(m.admission_counters[0]) == {3: 1}
    assert counts_of(m.admission_counters[1]) == {4: 1}
    assert counts_of(template) == {}


@pytest.mark.parametrize(
    "strategy, counter, error, text",
    [
        (FrequencyAdmissionStrategy(2), None, ValueError, "has no counter to count keys with"),
        (3, KVCounter(64, 16), TypeError, "admit_strategy must be an AdmissionStrategy"),
        (None, {}, TypeError, "admission counter must be a Counter"),
    ],
)
def test_bad_admission_options_name_the_table(strategy, counter, error, text, recwarn):
    opts = DynamicEmbTableOptions(
        dim=4, max_capacity=256, admit_strategy=strategy, admission_counter=counter
    )
    with pytest.raises(error, match=f"'clicks'.*{text}"):
        BatchedDynamicEmbeddingTables([opts], feature_table_map=[0], table_names=["clicks"])
