"""DeltaPublisher over a model row-wise sharded on 2 gloo ranks: rank 0 writes one
delta of both ranks' changes; a serving module that loads the base and replays the
deltas looks up every key ever seen (evicted and erased ones included) exactly as
the trained model does in eval mode; a failed write raises on both ranks and loses
no change."""

import pytest
import torch

from dynemb.deltas import delta_path, read_delta
from dynemb.inference.exportable_tables import InferenceEmbeddingCollection
from tests.support.delta_sharded_workers import (
    EVAL_VALUE,
    FEATURE_TABLE,
    FEATURES,
    table_options,
    train_and_publish,
)
from tests.support.multiprocess import run_ranks

pytestmark = pytest.mark.no_emulated_pass(
    "spawned gloo ranks; the lookups and the replay run on the executor in test_delta_replay.py"
)


@pytest.fixture(scope="module", params=["roundrobin", "hash_roundrobin"])
def published(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(request.param)
    return (
        request.param,
        root,
        run_ranks(train_and_publish, 2, str(root), request.param, timeout=120),
    )


def test_replaying_the_deltas_gives_the_trained_models_eval_lookups(published):
    dist_type, root, ranks = published
    r0, r1 = ranks
    assert r0["version"] == r1["version"] >= 4
    assert torch.equal(r0["seen"], r1["seen"])
    for f in FEATURES:  # every rank looked up every key: the same rows
        assert torch.equal(r0["rows"][f], r1["rows"][f])

    serving = InferenceEmbeddingCollection(
        [table_options(t, dist_type, capacity=256) for t in range(2)],
        table_names=["t0", "t1"],
        feature_table_map=FEATURE_TABLE,
    )
    serving.load_from_dynamicemb_file(root / "base")
    tombstones = 0
    for version in range(1, r0["version"] + 1):
        assert serving.apply_delta(delta_path(root, version)) == version
        tombstones += sum(
            t.tombstones.numel() for t in read_delta(delta_path(root, version)).tables.values()
        )
    seen = r0["seen"]
    n = seen.numel()
    got = serving(seen.repeat(len(FEATURES)), torch.arange(len(FEATURES) * n + 1))
    for i, f in enumerate(FEATURES):
        assert torch.equal(got[i * n : (i + 1) * n], r0["rows"][f]), f
    assert serving.sizes == [r0["sizes"][t] + r1["sizes"][t] for t in ("t0", "t1")]

    # Keys evicted or erased on both ranks' shards read the eval initializer, in both.
    assert tombstones > 0
    for t, f in (("t0", "f0"), ("t1", "f2")):
        missing = ~(r0["stored"][t] | r1["stored"][t])
        assert missing.any()
        value = EVAL_VALUE[FEATURE_TABLE[FEATURES.index(f)]]
        assert torch.equal(r0["rows"][f][missing], torch.full((int(missing.sum()), 4), value))


def test_a_failed_write_raises_on_every_rank_and_loses_no_change(published):
    _, _, ranks = published
    for r in ranks:
        [(error, version_kept)] = r["failures"]
        assert error is not None and error[0] == "FileExistsError", error
        assert version_kept
    assert "exists already" in ranks[0]["failures"][0][0][1]
    assert "rank 0 of 2 failed to write the delta" in ranks[1]["failures"][0][0][1]
    # No change lost: the replay test above equals the trained model after this failure.


def test_background_publication_is_refused_over_several_processes(published):
    for r in published[2]:
        assert "background=True is for single-process models" in r["refusal"]


def test_a_rank_that_cannot_publish_makes_every_rank_refuse(published):
    r0, r1 = published[2]
    assert "rank 1: DeltaPublisher: table 't0' is already tracked" in r0["refused_on_every_rank"]
    assert r1["refused_on_every_rank"] == "DeltaPublisher: table 't0' is already tracked"
