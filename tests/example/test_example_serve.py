"""example.py --publish_every K, then examples/serve.py: the served model (base + deltas
replayed into inference modules, exported with torch.export, saved and loaded) scores
the held-out set with the trained model's logits bit for bit, at the last version and
at an intermediate one (the model evaluated after epoch 1 of 2)."""

from pathlib import Path

import pytest
import torch

from dynemb._example import publishing
from dynemb.deltas import delta_path, read_delta
from examples import serve
from tests.support.example_runs import run_example
from tests.support.multiprocess import free_port

# 8 steps per epoch; tables of 256 rows for 1,000 ids per feature (rows are evicted).
SIZES = "--num_train 2048 --num_eval 600 --vocab_size 1000 --capacity 256 --batch_size 256"
EVERY = 3  # versions 1, 2 at steps 3, 6, 3 at the end of epoch 1; 4, 5, 6 in epoch 2
EPOCH_VERSIONS = [3, 6]


ADAM_ONCE = pytest.mark.no_emulated_pass(
    "ADAM only makes the ordinary table dynamic too; the executor's table ops are those of "
    "the default optimizer's case, which both passes run"
)


@pytest.fixture(
    scope="module", params=["EXACT_ROWWISE_ADAGRAD", pytest.param("ADAM", marks=ADAM_ONCE)]
)
def published(request, tmp_path_factory):
    """(publish directory, the trained model's evaluations); ADAM on CPU makes every
    table dynamic, the default optimizer keeps one ordinary TorchRec table."""
    root = tmp_path_factory.mktemp(request.param)
    args = ["--train", "--eval", "--epochs", "2", *SIZES.split(), "--optimizer", request.param]
    args += ["--publish-every", str(EVERY), "--publish_dir", str(root / "pub")]
    args += ["--scores_out", str(root / "trained.pt")]
    assert f"published versions 0..{EPOCH_VERSIONS[-1]}" in run_example(args)
    return root / "pub", torch.load(root / "trained.pt", weights_only=False)


def _serve(directory: Path, tmp_path: Path, *flags: str) -> dict:
    out = tmp_path / "served.pt"
    argv = ["--publish_dir", str(directory), "--program", str(tmp_path / "m.pt2")]
    assert serve.main([*argv, "--scores_out", str(out), *flags]) == 0
    return torch.load(out, weights_only=False)


def test_the_latest_version_scores_as_the_trained_model(published, tmp_path, capsys):
    directory, trained = published
    final = trained[-1]
    served = _serve(directory, tmp_path)
    assert served["version"] == final["version"] == EPOCH_VERSIONS[-1]
    assert served["logits"].shape == (600,)
    assert torch.equal(served["logits"], final["logits"])
    assert served["auc"] == final["auc"]
    assert f"held-out AUC {final['auc']:.4f}" in capsys.readouterr().out


def test_an_intermediate_version_scores_as_the_model_at_that_step(published, tmp_path):
    directory, trained = published
    epoch_1 = trained[0]
    assert epoch_1["version"] == EPOCH_VERSIONS[0]
    served = _serve(directory, tmp_path, "--version", str(EPOCH_VERSIONS[0]))
    assert torch.equal(served["logits"], epoch_1["logits"])
    assert served["auc"] == epoch_1["auc"]
    assert not torch.equal(served["logits"], trained[-1]["logits"])  # another model


@pytest.mark.parametrize("weights_dtype", ["int8", "e4m3"])
def test_8bit_rows_score_near_the_trained_model(published, tmp_path, capsys, weights_dtype):
    """--weights_dtype: the base and every delta quantized as they load; the logits move
    a little (not bit for bit any more), the AUC hardly."""
    directory, trained = published
    final = trained[-1]
    served = _serve(directory, tmp_path, "--weights_dtype", weights_dtype)
    assert served["version"] == final["version"]
    assert not torch.equal(served["logits"], final["logits"])
    assert float((served["logits"] - final["logits"]).abs().max()) < 0.05
    assert abs(served["auc"] - final["auc"]) < 0.01
    assert f"({weights_dtype} rows)" in capsys.readouterr().out


def test_every_version_is_published_and_deltas_remove_evicted_keys(published):
    directory, _ = published
    assert publishing.published_versions(directory) == list(range(EPOCH_VERSIONS[-1] + 1))
    deltas = [read_delta(delta_path(directory, v)) for v in range(1, EPOCH_VERSIONS[-1] + 1)]
    assert sum(t.tombstones.numel() for d in deltas for t in d.tables.values()) > 0


def test_ordinary_tables_publish_the_rows_that_changed(published):
    """dense-N holds the rows of the ordinary table (f6, 1,000 rows) that steps
    (N-1, N] trained: some, not all; replayed, they give the table of version N."""
    directory, _ = published
    saved = [torch.load(publishing.dense_path(directory, v)) for v in range(EPOCH_VERSIONS[-1] + 1)]
    if not saved[0]["tables"]:  # ADAM on CPU: every table is dynamic
        assert all(not s["tables"] for s in saved)
        return
    (name,) = saved[0]["tables"]
    rows, whole = saved[0]["tables"][name]
    assert rows is None and whole.shape[0] == 1000
    table = whole.clone()
    for v in range(1, len(saved)):
        rows, values = saved[v]["tables"][name]
        assert 0 < rows.numel() < 1000
        assert (table[rows] != values).any(dim=1).all()  # each of them changed
        table[rows] = values
    _, tables = publishing.read_version(directory, len(saved) - 1)
    assert torch.equal(tables[name], table)


@pytest.mark.no_emulated_pass(
    "two torchrun processes and an export: the executor's ops are those of the one-process runs"
)
def test_two_processes_publish_what_one_serves(tmp_path, capsys):
    """torchrun with 2 gloo ranks: rank 0 writes every version (its deltas gather both
    ranks' changes, its dense-N the ordinary table gathered whole); served, the latest
    scores the held-out rows with the trained logits (training lists them rank after
    rank, serve.py in row order: compared sorted) and the same AUC."""
    pub = tmp_path / "pub"
    torchrun = ("-m", "torch.distributed.run", "--nproc_per_node=2")
    torchrun += ("--master_port", str(free_port()))
    args = ["--train", "--eval", *SIZES.split(), "--publish_every", str(EVERY)]
    args += ["--publish_dir", str(pub), "--scores_out", str(tmp_path / "trained.pt")]
    assert "2 rank(s)" in run_example(args, torchrun, OMP_NUM_THREADS="1")
    trained = torch.load(tmp_path / "trained.pt", weights_only=False)[-1]
    assert publishing.published_versions(pub) == list(range(trained["version"] + 1))
    assert len(torch.load(publishing.dense_path(pub, 0))["tables"]) == 1  # f6, gathered
    served = _serve(pub, tmp_path)
    assert served["version"] == trained["version"] == 2  # step 3 of 4, the epoch's end
    assert torch.equal(served["logits"].sort().values, trained["logits"].sort().values)
    assert served["auc"] == trained["auc"]


def test_serve_refuses_a_version_not_published(published, tmp_path, capsys):
    directory, _ = published
    assert serve.main(["--publish_dir", str(directory), "--version", "7"]) == 2
    assert "--version 7" in capsys.readouterr().err
    assert serve.main(["--publish_dir", str(tmp_path)]) == 2  # nothing published there
    assert "no example.json" in capsys.readouterr().err


def test_published_versions_stop_at_the_first_incomplete_one(tmp_path):
    for name in ("base", "delta-00000001", "delta-00000002", "delta-00000004"):
        (tmp_path / name).mkdir()
    for v in (0, 1, 3, 4):  # dense-2 missing: versions 0 and 1 are complete
        publishing.dense_path(tmp_path, v).touch()
    assert publishing.published_versions(tmp_path) == [0, 1]
    publishing.dense_path(tmp_path, 2).touch()  # 3 has no delta
    assert publishing.published_versions(tmp_path) == [0, 1, 2]


@pytest.mark.parametrize(
    "flags, env, message",
    [
        ("--eval --publish_every 4", {}, "give --train"),
        ("--train --publish_every -1", {}, "K must be a number of steps >= 1"),
        ("--train --static --publish_every 4", {}, "not with --static"),
        ("--train --caching --publish_every 4", {}, "not with --caching"),
        ("--train --publish_every 4 --publish_dir FULL", {}, "must be a new or empty directory"),
    ],
)
def test_example_refuses_what_it_cannot_publish(flags, env, message, tmp_path, monkeypatch):
    import example

    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").touch()
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    argv = flags.replace("FULL", str(tmp_path / "full")).split()
    if "--publish_dir" not in argv:
        argv += ["--publish_dir", str(tmp_path / "new")]
    refusal = example.publish_refusal(example.parse_args(argv))
    assert refusal is not None and message in refusal
    assert not (tmp_path / "new").exists()
