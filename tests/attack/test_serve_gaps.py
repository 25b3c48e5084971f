"""examples/serve.py serves exactly the version asked for (the latest: the highest
committed delta) or refuses, naming the missing or damaged file: a missing delta or
dense file is never skipped by serving an older version, and a damaged file is named.
A dense file of a version whose delta is not committed yet (a publication in
progress) is not a version."""

import shutil
from pathlib import Path

import pytest
import torch

from dynemb._example import publishing
from dynemb.deltas import delta_path
from examples import serve
from tests.support.example_runs import run_example

pytestmark = pytest.mark.no_emulated_pass(
    "the files of a publish directory; the executor's ops are those of test_example_serve.py"
)

# 4 steps of one epoch, a version after each: versions 0..4.
SIZES = "--num_train 1024 --num_eval 256 --vocab_size 500 --capacity 256 --batch_size 256"
LATEST = 4


@pytest.fixture(scope="module")
def published(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("published")
    stdout = run_example(
        ["--train", *SIZES.split(), "--publish_every", "1", "--publish_dir", str(root / "pub")]
    )
    assert f"published versions 0..{LATEST}" in stdout
    return root / "pub"


@pytest.fixture
def copy(published, tmp_path) -> Path:
    """A copy of the publish directory, for a test to damage."""
    return Path(shutil.copytree(published, tmp_path / "pub"))


def _refusal(directory: Path, tmp_path: Path, capsys, *flags: str) -> str:
    argv = ["--publish_dir", str(directory), "--program", str(tmp_path / "m.pt2"), *flags]
    assert serve.main(argv) == 2
    return capsys.readouterr().err


def _served_version(directory: Path, tmp_path: Path, *flags: str) -> int:
    out = tmp_path / "served.pt"
    argv = ["--publish_dir", str(directory), "--program", str(tmp_path / "m.pt2")]
    assert serve.main([*argv, "--scores_out", str(out), *flags]) == 0
    return torch.load(out, weights_only=False)["version"]


def test_a_missing_delta_is_named_not_skipped(copy, tmp_path, capsys):
    shutil.rmtree(delta_path(copy, 1))
    for flags in ((), ("--version", "2"), ("--version", str(LATEST))):
        err = _refusal(copy, tmp_path, capsys, *flags)
        assert "delta-00000001" in err, (flags, err)
    shutil.rmtree(delta_path(copy, 3))  # every missing file is named
    err = _refusal(copy, tmp_path, capsys)
    assert "delta-00000001" in err and "delta-00000003" in err, err


def test_a_missing_dense_file_is_named_not_skipped(copy, tmp_path, capsys):
    publishing.dense_path(copy, 2).unlink()
    for flags in ((), ("--version", "2"), ("--version", str(LATEST))):
        err = _refusal(copy, tmp_path, capsys, *flags)
        assert "dense-00000002.pt" in err, (flags, err)


def test_a_truncated_dense_file_is_named(copy, tmp_path, capsys):
    path = publishing.dense_path(copy, 1)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    err = _refusal(copy, tmp_path, capsys, "--version", "1")
    assert "dense-00000001.pt" in err, err
    with pytest.raises(ValueError, match="dense-00000001.pt"):
        publishing.read_version(copy, 1)


def test_a_missing_base_is_named(copy, tmp_path, capsys):
    shutil.rmtree(copy / "base")
    assert "base/ missing" in _refusal(copy, tmp_path, capsys, "--version", "0")


def test_a_version_not_published_is_refused(copy, tmp_path, capsys):
    err = _refusal(copy, tmp_path, capsys, "--version", str(LATEST + 1))
    assert f"--version {LATEST + 1}" in err and f"the latest is {LATEST}" in err, err


def test_what_is_whole_is_served(copy, tmp_path):
    """A dense file without its delta (a publication in progress) is not a version:
    the latest is the last committed delta; a whole version before a gap is served
    when asked for by number."""
    shutil.copy(publishing.dense_path(copy, LATEST), publishing.dense_path(copy, LATEST + 1))
    assert _served_version(copy, tmp_path) == LATEST
    shutil.rmtree(delta_path(copy, 3))
    assert _served_version(copy, tmp_path, "--version", "2") == 2
