"""A prefetch on its own stream, as TorchRec's prefetch pipeline runs it, trains as
one stream does.

The loop is the pipeline's: batch t+1 is prefetched on the prefetch stream, with
``forward_stream`` the default one, between batch t's forward and its backward on the
default stream. On the emulated executor's stream model the results equal the same
loop run at once, and the forward stream waits for each prefetch (without that
event, its reads come first). On a GPU (``DYNEMB_TEST_CUDA=1``) the same loop runs on torch.cuda
streams.
"""

import contextlib

import pytest
import torch

from dynemb import BatchedDynamicEmbeddingTables, DynamicEmbPoolingMode, _ops, streams
from dynemb.emulated_streams import StreamModel, emulated_streams
from dynemb.optimizer import EmbOptimType
from tests.support.caching_models import batches, options
from tests.support.devices import cuda_ready

EMULATED = _ops.executor() == "cuda-emulated"


def _cached(device="cpu"):
    # A small cache: prefetches evict the rows of batches whose backward is queued.
    return BatchedDynamicEmbeddingTables(
        [options(64, state=1), options(64, state=1)], feature_table_map=[0, 1, 1],
        pooling_mode=DynamicEmbPoolingMode.SUM, optimizer=EmbOptimType.EXACT_ROWWISE_ADAGRAD,
        learning_rate=0.1, device=device,
    )  # fmt: skip


def _train(m, data, prefetch_stream=None, use=None, forward_stream=None) -> list:
    """The pipeline's loop; ``use(stream)`` makes a stream current (None: one stream)."""
    use = use or (lambda s: contextlib.nullcontext())
    outs = []
    with use(prefetch_stream):
        m.prefetch(*data[0], forward_stream=forward_stream)
    for t, batch in enumerate(data):
        out = m(*batch)
        if t + 1 < len(data):
            with use(prefetch_stream):
                m.prefetch(*data[t + 1], forward_stream=forward_stream)
        (out * torch.linspace(-1, 1, out.shape[1], device=out.device)).sum().backward()
        outs.append(out.detach())
    return outs


def _rows(m) -> torch.Tensor:
    keys = torch.arange(-1200, 3_200_000, 7919)
    rows = []
    for table in m.tables:
        table.sync()
        values, found = table.persistent_table().find(keys.to(table.device))
        rows.append(torch.where(found[:, None], values, 0).cpu())
    return torch.cat(rows, 1)


def _streamed(data, seed):
    m = _cached()
    with emulated_streams(seed) as model:
        prefetch = model.new_stream("prefetch")
        outs = _train(m, data, prefetch, model.use, model.default)
    return outs, _rows(m)


def _equal(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


@pytest.mark.skipif(not EMULATED, reason="streams exist on the emulated executor")
def test_prefetch_stream_trains_as_one_stream(monkeypatch):
    data = batches(4, seed=3)
    reference = _cached()
    want = _train(reference, data)
    want_rows = _rows(reference)
    waits = []
    original = StreamModel.wait
    monkeypatch.setattr(
        StreamModel, "wait", lambda self, s, e: waits.append(s.name) or original(self, s, e)
    )
    for seed in range(3):
        outs, rows = _streamed(data, seed)
        assert _equal(outs, want), f"seed {seed}"
        assert torch.equal(rows, want_rows), f"seed {seed}"
    # Each stream waited for the other: the tables' ops, and the forward stream for
    # each prefetch (forward_stream).
    assert {"default", "prefetch"} <= set(waits)


@pytest.mark.skipif(not EMULATED, reason="streams exist on the emulated executor")
def test_forward_stream_waits_for_the_prefetch(monkeypatch):
    # What a prefetch leaves for the forward (``hand_over``) is written before the
    # forward stream reads it; without the event the forward stream's read, a host
    # read of that stream only, comes first. (The cached tables' claims read the
    # device, which runs their prefetch's queue anyway: the table ops' own events
    # are shown failing in tests/table/test_stream_order.py.)
    def run() -> torch.Tensor:
        kept = torch.arange(4.0)
        with emulated_streams() as model:
            prefetch = model.new_stream("prefetch")
            with model.use(prefetch):
                kept.mul_(10)
                streams.hand_over(torch.device("cpu"), model.default, [kept])
            seen = kept + 1
            streams.host_read(seen)
            return seen.clone()

    assert torch.equal(run(), torch.tensor([1.0, 11.0, 21.0, 31.0]))
    monkeypatch.setattr(StreamModel, "wait", lambda self, stream, event: None)
    assert torch.equal(run(), torch.tensor([1.0, 2.0, 3.0, 4.0]))


@pytest.mark.skipif(not EMULATED, reason="streams exist on the emulated executor")
def test_forward_stream_must_be_a_stream():
    m = _cached()
    with emulated_streams():
        with pytest.raises(TypeError, match="forward_stream must be None or a stream of cpu"):
            m.prefetch(*batches(1)[0], forward_stream="default")
    assert m.tables[0].batches_in_flight() == 0  # refused before anything changed


@pytest.mark.skipif(not cuda_ready(), reason="needs a GPU (DYNEMB_TEST_CUDA=1)")
def test_prefetch_stream_trains_as_one_stream_on_a_gpu():
    # What only a GPU shows: the events between torch.cuda streams order the kernels.
    data = [(i.cuda(), o.cuda()) for i, o in batches(6, seed=3)]
    reference = _cached("cuda")
    want = _train(reference, data)
    m = _cached("cuda")
    prefetch = torch.cuda.Stream()
    outs = _train(m, data, prefetch, torch.cuda.stream, torch.cuda.current_stream())
    torch.cuda.synchronize()
    assert _equal(outs, want)
    assert torch.equal(_rows(m).cpu(), _rows(reference).cpu())
