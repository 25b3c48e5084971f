"""``WarmStart.from_storage`` checks every result of the storage's ``find`` (a tuple of
rows, scores and found, each of the batch's length, shape and dtype) and refuses a
wrong one with a ValueError naming the storage and what it returned; a table whose
lookup it fails stores nothing."""

import pytest
import torch

from dynemb import ScoredHashTable
from dynemb.tiering import StorageSpec
from dynemb.types import DynamicEmbScoreStrategy
from dynemb.warm_start import TableFill, WarmStart
from tests.support.caching_models import DictStorage


class BadStorage(DictStorage):
    """A DictStorage whose ``find`` result is spoilt by ``spoil`` for non-empty batches."""

    def __init__(self, spec, spoil) -> None:
        super().__init__(spec)
        self.spoil = spoil

    def find(self, keys):
        result = super().find(keys)
        return self.spoil(*result) if keys.numel() else result


def _storage(spoil) -> BadStorage:
    spec = StorageSpec(4, 0, torch.float32, 64, DynamicEmbScoreStrategy.TIMESTAMP, 16,
                       torch.device("cpu"))  # fmt: skip
    storage = BadStorage(spec, spoil)
    for key in range(8):
        storage.rows[key] = (torch.full((4,), float(key)), 0)
    return storage


CASES = {
    "found one short": (
        lambda r, s, f: (r, s, f[1:]),
        r"found a \(4,\) torch.bool tensor for 5 keys, "
        r"expected a \(5,\) torch.bool tensor",
    ),
    "found of ints": (
        lambda r, s, f: (r, s, f.to(torch.int64)),
        r"found a \(5,\) torch.int64 tensor for 5 keys, expected a \(5,\) torch.bool",
    ),
    "found not a tensor": (
        lambda r, s, f: (r, s, f.tolist()),
        r"found a list for 5 keys, expected a \(5,\) torch.bool tensor",
    ),
    "rows one short": (
        lambda r, s, f: (r[1:], s, f),
        r"rows a \(4, 4\) torch.float32 tensor for 5 keys, expected a \(5, 4\) "
        r"floating tensor \(dim 4 \+ state 0\)",
    ),
    "rows of ints": (
        lambda r, s, f: (r.to(torch.int64), s, f),
        r"rows a \(5, 4\) torch.int64 tensor for 5 keys, expected a \(5, 4\) floating",
    ),
    "scores one short": (
        lambda r, s, f: (r, s[1:], f),
        r"scores a \(4,\) torch.int64 tensor for 5 keys, expected a \(5,\) torch.int64",
    ),
    "two results": (
        lambda r, s, f: (r, f),
        r"a tuple of 2, expected \(rows, scores, found\)",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_wrong_storage_result_is_refused_naming_it(case):
    spoil, match = CASES[case]
    source = WarmStart.from_storage(_storage(spoil), dim=4)
    with pytest.raises(
        ValueError, match=r"WarmStart.from_storage: BadStorage.find returned " + match
    ):
        source.rows(torch.arange(3, 8))


def test_a_lookup_it_fails_stores_nothing(device):
    source = WarmStart.from_storage(_storage(lambda r, s, f: (r, s, f[1:])), dim=4)
    table = ScoredHashTable(dim=4, capacity=64, bucket_capacity=16, device=device)
    table.warm_start = TableFill(source, 4, 0, torch.float32, "t")  # its empty read is right
    with pytest.raises(ValueError, match=r"found a \(4,\) torch.bool tensor"):
        table.find_or_insert(torch.arange(3, 8, device=device))
    assert table.size() == 0
    table.warm_start.source.storage.spoil = lambda r, s, f: (r, s, f)
    rows = table.find_or_insert(torch.arange(3, 8, device=device))
    assert torch.equal(rows.cpu(), torch.arange(3, 8).float()[:, None].expand(5, 4))
