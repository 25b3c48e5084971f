"""DYNAMICEMB_API.md section 9: KVCounter as a plain, picklable configuration, and
FrequencyAdmissionStrategy's threshold."""

import pickle

import pytest
import torch

from dynemb import FrequencyAdmissionStrategy, KVCounter

pytestmark = pytest.mark.no_emulated_pass("configuration objects: Python only")


@pytest.mark.parametrize(
    "capacity, bucket, want_capacity, want_bucket",
    [(128, 1024, 1024, 1024), (1, 16, 16, 16), (1000, 100, 1008, 112), (4096, 1024, 4096, 1024)],
)
def test_kv_counter_rounds_up_to_whole_buckets(capacity, bucket, want_capacity, want_bucket):
    c = KVCounter(capacity=capacity, bucket_capacity=bucket)
    assert (c.capacity, c.bucket_capacity) == (want_capacity, want_bucket)
    assert c.key_type == torch.int64


def test_kv_counter_pickles_before_and_after_use():
    template = KVCounter(capacity=128, bucket_capacity=1024, key_type=torch.int64)
    copy = pickle.loads(pickle.dumps(template))
    assert (copy.capacity, copy.size()) == (1024, 0)
    template.add(torch.tensor([3, 3, 4]))
    restored = pickle.loads(pickle.dumps(template))
    keys, counts = restored.dump()
    assert sorted(zip(keys.tolist(), counts.tolist())) == [(3, 2), (4, 1)]


def test_frequency_admission_threshold_zero_admits_everything():
    s = FrequencyAdmissionStrategy(threshold=0)
    assert s.admit(torch.tensor([1, 2]), torch.tensor([0, 1])).tolist() == [True, True]


def test_frequency_admission_negative_threshold_raises():
    with pytest.raises(ValueError, match="threshold must be >= 0, got -1"):
        FrequencyAdmissionStrategy(threshold=-1)
