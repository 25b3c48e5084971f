"""DynamicEmb's layout carries no checksum; what can be verified is, before any table
changes: a key saved twice and a negative score or count are refused before the first
table is emptied, never half way through the load."""

import numpy as np
import pytest
import torch

from dynemb import (
    BatchedDynamicEmbeddingTables,
    CheckpointError,
    DynamicEmbDump,
    DynamicEmbLoad,
    DynamicEmbScoreStrategy,
    DynamicEmbTableOptions,
    FrequencyAdmissionStrategy,
    KVCounter,
)

pytestmark = pytest.mark.no_emulated_pass("file-format validation, before any table op")

KEYS = torch.arange(1, 33)


def _module(strategy=DynamicEmbScoreStrategy.LFU):
    options = DynamicEmbTableOptions(
        dim=4,
        max_capacity=256,
        score_strategy=strategy,
        admit_strategy=FrequencyAdmissionStrategy(
            threshold=2, counter=KVCounter(capacity=64, bucket_capacity=16)
        ),
    )
    return BatchedDynamicEmbeddingTables([options], [0], table_names=["t"])


def _train(module, keys=KEYS):
    module(keys, torch.arange(keys.numel() + 1)).sum().backward()


def _dumped(tmp_path):
    """Keys 1..16 seen twice (stored), 17..32 once (counted, not admitted)."""
    trained = _module()
    _train(trained)
    _train(trained, KEYS[:16])
    DynamicEmbDump(tmp_path / "ckpt", trained, format="dynamicemb", counter=True)
    return tmp_path / "ckpt" / "model"


def _file(directory, field):
    (file,) = directory.glob(f"t_{field}.rank_0.world_size_1")
    return file


def _edit(file, change) -> None:
    values = np.fromfile(file, dtype=np.int64)
    change(values)
    values.tofile(file)


def _stored(module):
    keys, values, scores, _ = module.tables[0].export_batch(0, module.tables[0].capacity())
    order = torch.argsort(keys)
    return keys[order], values[order], scores[order]


def _duplicate_first(values):
    values[1] = values[0]


def _negate_first(values):
    values[0] = -5


CASES = {
    "a key saved twice": (
        "emb_keys",
        _duplicate_first,
        r"table 't': key \d+ is saved more than once",
    ),
    "a negative score": ("emb_scores", _negate_first, r"emb_scores.*row 0 holds -5.*>= 0"),
    "a counted key saved twice": ("counter_keys", _duplicate_first, r"is saved more than once"),
}


@pytest.mark.parametrize("case", CASES)
def test_what_can_be_verified_is_refused_before_anything_changes(tmp_path, case):
    directory = _dumped(tmp_path)
    field, change, message = CASES[case]
    _edit(_file(directory, field), change)
    module = _module()
    _train(module, torch.tensor([100, 101, 100, 101]))
    before = _stored(module)
    with pytest.raises(CheckpointError, match=message):
        DynamicEmbLoad(tmp_path / "ckpt", module, counter=True)
    after = _stored(module)
    assert all(torch.equal(a, b) for a, b in zip(before, after))


def test_an_intact_checkpoint_loads(tmp_path):
    _dumped(tmp_path)
    module = _module()
    DynamicEmbLoad(tmp_path / "ckpt", module, counter=True)
    assert _stored(module)[0].tolist() == KEYS[:16].tolist()
