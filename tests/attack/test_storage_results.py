"""An external Storage whose results do not fit the table's rows is named in the error:
results of the wrong shape are refused with a TypeError naming the table, the Storage
method and what it returned, not a raw shape error from inside the cache."""

import pytest
import torch

from dynemb import BatchedDynamicEmbeddingTables, DynamicEmbTableOptions
from dynemb.tiering import Storage

DIM = 4
KEYS = torch.arange(1, 9)
OFFSETS = torch.arange(KEYS.numel() + 1)  # one feature, one key per bag


class _Broken(Storage):
    """Stores nothing; ``find`` / ``insert`` return what ``fault`` makes of a good answer."""

    fault = None

    def __init__(self, spec):
        self.spec = spec

    def find(self, keys):
        n, w = keys.numel(), self.spec.row_width
        rows = torch.zeros((n, w), dtype=self.spec.value_dtype)
        good = rows, torch.zeros(n, dtype=torch.int64), torch.zeros(n, dtype=torch.bool)
        return self.fault("find", good)

    def insert(self, keys, rows, scores):
        return self.fault("insert", (keys, rows, scores))  # drops all it is given

    def erase(self, keys):
        return 0

    def export_batch(self, offset, n):
        return torch.zeros(0, dtype=torch.int64), torch.zeros(0, DIM), torch.zeros(0), 0

    def end_offset(self):
        return 0

    def size(self):
        return 0


def _module(fault):
    storage = type("WideRows", (_Broken,), {"fault": staticmethod(fault)})
    options = DynamicEmbTableOptions(
        dim=DIM,
        max_capacity=1024,
        caching=True,
        local_hbm_for_values=16 * 4 * DIM,  # 16 cached rows: the rest go to the storage
        external_storage=storage,
    )
    return BatchedDynamicEmbeddingTables([options], [0], table_names=["t"])


def _keep(method, good):
    return good


def _train(module, batches=4):
    for b in range(batches):
        module(KEYS + 100 * b, OFFSETS).sum().backward()


FAULTS = {
    "find rows one column wider": (
        lambda m, g: (torch.cat([g[0], g[0][:, :1]], 1), *g[1:]) if m == "find" else g,
        r"WideRows.find \(its external_storage\) returned rows a \(8, 5\) torch.float32 "
        r"tensor, expected a \(8, 4\) torch.float32 tensor",
    ),
    "find rows as float64": (
        lambda m, g: (g[0].double(), *g[1:]) if m == "find" else g,
        r"WideRows.find .*returned rows a \(8, 4\) torch.float64 tensor, expected a \(8, 4\) "
        r"torch.float32",
    ),
    "find found as int": (
        lambda m, g: (*g[:2], g[2].long()) if m == "find" else g,
        r"WideRows.find .*returned found a \(8,\) torch.int64 tensor, expected a \(8,\) "
        r"torch.bool tensor",
    ),
    "find returns two things": (
        lambda m, g: g[:2] if m == "find" else g,
        r"WideRows.find \(its external_storage\) returned result a tuple of 2, expected a "
        r"tuple of 3 tensors",
    ),
    "insert drops rows of another width": (
        lambda m, g: (g[0], g[1][:, :2], g[2]) if m == "insert" else g,
        r"WideRows.insert \(its external_storage\) returned dropped rows a \(\d+, 2\)",
    ),
}


@pytest.mark.parametrize("fault", FAULTS)
def test_a_storage_result_that_does_not_fit_is_refused_naming_the_storage(fault):
    make, message = FAULTS[fault]
    with pytest.raises(TypeError, match=r"table 't': " + message):
        _train(_module(make))


def test_a_storage_that_answers_well_trains():
    module = _module(_keep)
    _train(module)
    assert module.tables[0].storage.spec.row_width == DIM
