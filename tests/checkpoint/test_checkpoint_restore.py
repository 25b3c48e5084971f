"""DynamicEmbLoad restores the checkpoint: keys stored after the dump are gone and the
steps are the saved ones; ``merge=True`` inserts over the tables as they are
(DynamicEmb's behaviour, for chains of incremental checkpoints)."""

import pytest
import torch

from dynemb import BatchedDynamicEmbeddingTables, DynamicEmbTableOptions
from dynemb.admission_strategies import FrequencyAdmissionStrategy, KVCounter
from dynemb.checkpoint import DynamicEmbDump, DynamicEmbLoad
from tests.support.checkpoint_tables import contents, make_module, same, train

FORMATS = ["dynemb", "dynamicemb"]


@pytest.mark.parametrize("format", FORMATS)
def test_load_rolls_back_keys_trained_after_the_dump(tmp_path, format):
    module = make_module()
    train(module, torch.arange(0, 200))
    DynamicEmbDump(tmp_path / "ckpt", module, optim=True, format=format)
    saved, saved_step = contents(module), module.step
    saved_score_steps = [t.score_step for t in module.tables]
    train(module, torch.tensor([999, 1999, 5, 105]))  # new keys, and updates of old ones
    assert bool(module.tables[0].contains(torch.tensor([999])).all())
    DynamicEmbLoad(tmp_path / "ckpt", module, optim=True)
    assert not bool(module.tables[0].contains(torch.tensor([999, 1999])).any())
    assert same(contents(module), saved) if format == "dynemb" else _same_rows(module, saved)
    assert module.step == saved_step
    assert [t.score_step for t in module.tables] == saved_score_steps


def _same_rows(module, saved) -> bool:
    """DynamicEmb's layout saves ages for TIMESTAMP scores: compare keys and rows."""
    return all(
        torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
        for got, want in zip(contents(module), saved, strict=True)
    )


@pytest.mark.parametrize("format", FORMATS)
def test_merge_keeps_what_the_tables_hold(tmp_path, format):
    module = make_module()
    train(module, torch.arange(0, 200))
    DynamicEmbDump(tmp_path / "ckpt", module, optim=True, format=format)
    saved = contents(module)
    train(module, torch.tensor([999, 1999]))
    step = module.step
    DynamicEmbLoad(tmp_path / "ckpt", module, optim=True, merge=True)
    assert bool(module.tables[0].contains(torch.tensor([999])).all())
    assert bool(module.tables[1].contains(torch.tensor([1999])).all())
    for (keys, rows, _), (want_keys, want_rows, _) in zip(contents(module), saved, strict=True):
        kept = torch.isin(keys, want_keys)
        assert torch.equal(keys[kept], want_keys) and torch.equal(rows[kept], want_rows)
    assert module.step == step  # the larger of the two


def test_admission_counts_are_restored_not_merged(tmp_path):
    def module():
        options = DynamicEmbTableOptions(
            dim=4,
            max_capacity=1024,
            admit_strategy=FrequencyAdmissionStrategy(
                threshold=5, counter=KVCounter(capacity=1024)
            ),
        )
        return BatchedDynamicEmbeddingTables([options], [0], table_names=["t"])

    m = module()
    train(m, [1, 2, 2])
    DynamicEmbDump(tmp_path / "ckpt", m, counter=True)
    train(m, [3, 1])  # counts after the dump: 1 -> 2, 3 -> 1
    DynamicEmbLoad(tmp_path / "ckpt", m, counter=True)
    keys, counts = m.admission_counters[0].dump()
    assert dict(zip(keys.tolist(), counts.tolist(), strict=True)) == {1: 1, 2: 2}
