"""A warm start from an Adam dump with its optimizer state carries the dump's optimizer
step into the module, as DynamicEmbLoad(optim=True) restores it: the next updates of
the warm-started model equal those of the loaded one (Adam's bias correction goes on
from the saved step instead of restarting at 1). Rows only (``optim=False``, or a
table of another optimizer) carry no step; tables of one module whose sources were
dumped at different steps take the largest, with a warning."""

import warnings

import pytest
import torch

from dynemb import (
    BatchedDynamicEmbeddingTables,
    DynamicEmbDump,
    DynamicEmbLoad,
    DynamicEmbPoolingMode,
    DynamicEmbTableOptions,
    WarmStart,
)
from dynemb.optimizer import EmbOptimType

KEYS = torch.tensor([5, -9, 2**40, 17, 3, 8])


def _module(sources=(None,), optimizer=EmbOptimType.ADAM):
    return BatchedDynamicEmbeddingTables(
        [DynamicEmbTableOptions(dim=4, max_capacity=256, bucket_capacity=16, warm_start=s)
         for s in sources],
        feature_table_map=list(range(len(sources))), pooling_mode=DynamicEmbPoolingMode.SUM,
        optimizer=optimizer, learning_rate=0.1, table_names=[f"t{i}" for i in range(len(sources))],
    )  # fmt: skip


def _train(module, steps: int, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    n = len(module.table_names)
    for _ in range(steps):
        keys = KEYS[torch.randperm(KEYS.numel(), generator=g)[:4]].repeat(n)
        offsets = torch.arange(0, 4 * n + 1, 4)
        out = module(keys, offsets)
        out.backward(torch.randn(out.shape, generator=g))


@pytest.mark.parametrize("format", ["dynemb", "dynamicemb"])
def test_a_warm_started_adam_model_trains_on_as_the_loaded_one(tmp_path, format):
    trained = _module()
    _train(trained, 7, seed=1)
    DynamicEmbDump(tmp_path, trained, optim=True, format=format)
    loaded = _module()
    DynamicEmbLoad(tmp_path, loaded, optim=True)
    warm = _module([WarmStart.from_dump(tmp_path, "t0")])
    _train(loaded, 3, seed=2)
    _train(warm, 3, seed=2)
    table = warm.tables[0]
    torch.testing.assert_close(
        table.find_entries(KEYS)[0], loaded.tables[0].find_entries(KEYS)[0], atol=1e-6, rtol=0
    )
    assert warm.step == loaded.step == 10


def test_rows_only_carry_no_step_and_different_steps_take_the_largest(tmp_path):
    paths = {}
    for steps in (3, 5):
        trained = _module()
        _train(trained, steps, seed=steps)
        paths[steps] = tmp_path / str(steps)
        DynamicEmbDump(paths[steps], trained, optim=True)
    assert _module([WarmStart.from_dump(paths[3], "t0", optim=False)]).step == 0
    sgd = _module([WarmStart.from_dump(paths[3], "t0")], optimizer=EmbOptimType.EXACT_SGD)
    assert sgd.step == 0  # SGD keeps no state: the source's is not used
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        same = [WarmStart.from_dump(paths[3], "t0"), WarmStart.from_dump(paths[3], "t0")]
        assert _module(same).step == 3
    both = [WarmStart.from_dump(paths[3], "t0"), WarmStart.from_dump(paths[5], "t0")]
    with pytest.warns(UserWarning, match=r"optimizer steps \{'t0': 3, 't1': 5\}.* takes 5"):
        assert _module(both).step == 5
