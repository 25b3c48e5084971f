"""Caching mode's prefetch pipeline: it overlaps on a spare core by default, prefetches
each batch before its step, and a forward reuses its prefetch; the thread limit is per
thread."""

import pytest
import torch

from dynemb.tiering import PrefetchPipeline
from dynemb.tiering.cache_fill import CacheFill
from tests.support.caching_models import batches, module, options, step


def test_pipeline_overlap_defaults_to_a_spare_core(monkeypatch):
    from dynemb.tiering import pipeline

    monkeypatch.setattr(pipeline.os, "sched_getaffinity", lambda pid: set(range(4)))
    monkeypatch.setattr(pipeline.torch, "get_num_threads", lambda: 4)
    assert PrefetchPipeline([], print, print).overlap is False
    monkeypatch.setattr(pipeline.torch, "get_num_threads", lambda: 3)
    assert PrefetchPipeline([], print, print).overlap is True
    assert PrefetchPipeline([], print, print, overlap=False).overlap is False


@pytest.mark.parametrize("overlap", [True, False])
def test_pipeline_prefetches_each_batch_before_its_step(overlap):
    events = []
    pipe = PrefetchPipeline(
        range(4), lambda b: events.append(("step", b)) or b,
        lambda b: events.append(("prefetch", b)), overlap=overlap,
    )  # fmt: skip
    assert pipe.run() == [0, 1, 2, 3]
    steps = [e for e in events if e[0] == "step"]
    assert steps == [("step", b) for b in range(4)]
    for b in range(4):  # prefetched once, before its own step
        assert events.count(("prefetch", b)) == 1
        assert events.index(("prefetch", b)) < events.index(("step", b))


def test_thread_limit_is_per_thread():
    import threading

    from dynemb import _ops

    main = torch.get_num_threads()
    seen = {}

    def worker():
        _ops.set_thread_limit(1)
        seen["worker"] = torch.get_num_threads()
        x = torch.randn(1 << 16)
        seen["sum"] = float(x.sum())  # an ATen parallel op runs under the limit

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert seen["worker"] == 1
    assert torch.get_num_threads() == main
    with pytest.raises(ValueError, match="n must be >= 1"):
        _ops.set_thread_limit(0)


@pytest.mark.parametrize("overlap", [True, False])
def test_forward_reuses_its_prefetch(overlap, monkeypatch):
    """A batch prefetched whole is not looked up again: its forward reuses the
    prefetch's distinct keys and slots (one cache fill per batch), same results."""
    data = batches(6, seed=5)
    plain = module([options(), options()])
    cached = module([options(128, state=1), options(128, state=1)])
    fills = []
    original = CacheFill.fill
    monkeypatch.setattr(
        CacheFill,
        "fill",
        lambda self, *a, **k: fills.append(k["stage"]) or original(self, *a, **k),
    )
    want = [step(plain, b) for b in data]
    got = PrefetchPipeline(
        data, lambda b: step(cached, b), lambda b: cached.prefetch(*b), overlap=overlap
    ).run()
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-5)
    assert fills == [False] * (2 * len(data))  # prefetches only, two tables
    changed = batches(1, seed=6)[0]
    cached.prefetch(*data[0])  # then a forward of other keys: looked up as usual
    step(cached, changed)
    assert fills[-2:] == [True, True]
