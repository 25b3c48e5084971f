"""A dump that fails (a full disk) removes its partial directory, names the file that
failed, leaves the previous checkpoint loadable, and the next dump that fits succeeds."""

import errno
import subprocess
import uuid

import pytest
import torch

from dynemb.checkpoint import DynamicEmbDump, DynamicEmbLoad
from dynemb.checkpoint.writer import committed_dump
from dynemb.dump_files import format as format_module
from dynemb.dump_files import manifest as manifest_module
from tests.support.checkpoint_tables import contents, make_module, same, train

pytestmark = pytest.mark.no_emulated_pass("filesystem failures during a dump: Python only")


def _dump_dirs(path) -> list[str]:
    return sorted(p.name for p in path.iterdir() if p.is_dir())


def _loads(path, want, **module_args) -> bool:
    module = make_module(**module_args)
    DynamicEmbLoad(path, module, optim=True)
    return same(contents(module), want)


class _FullAfter:
    """``open`` whose files raise ENOSPC once ``budget`` bytes were written in all."""

    def __init__(self, budget: int) -> None:
        self.budget = budget

    def __call__(self, file, mode="r", *args, **kwargs):
        f = open(file, mode, *args, **kwargs)  # returned, closed by the caller
        if "w" not in mode:
            return f
        full = self

        class _File:
            def __getattr__(self, name):
                return getattr(f, name)

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                f.close()

            def write(self, data):
                n = len(data) if isinstance(data, str) else len(memoryview(data).cast("B"))
                if n > full.budget:
                    raise OSError(errno.ENOSPC, "No space left on device")
                full.budget -= n
                return f.write(data)

        return _File()


@pytest.mark.parametrize("budget", [0, 3000, 20_000])
def test_enospc_while_writing_rows_cleans_up_and_names_the_file(tmp_path, monkeypatch, budget):
    module = make_module()
    train(module, torch.arange(-300, 300))
    path = tmp_path / "ckpt"
    DynamicEmbDump(path, module, optim=True)
    previous, committed = contents(module), committed_dump(path)
    train(module, torch.arange(0, 900))
    monkeypatch.setattr(format_module, "open", _FullAfter(budget), raising=False)
    with pytest.raises(OSError, match=r"writing .*ckpt/dump-[^/]+/[ab]\.r0\.\w+ failed") as e:
        DynamicEmbDump(path, module, optim=True, allow_overwrite=True)
    assert e.value.errno == errno.ENOSPC
    assert _dump_dirs(path) == [committed], "the failed dump left its directory"
    assert _loads(path, previous)
    monkeypatch.undo()
    DynamicEmbDump(path, module, optim=True, allow_overwrite=True)  # the next one fits
    assert _dump_dirs(path) == [committed_dump(path)] != [committed]
    assert _loads(path, contents(module))


def test_enospc_on_the_manifest_commits_nothing(tmp_path, monkeypatch):
    module = make_module()
    train(module, torch.arange(-300, 300))
    path = tmp_path / "ckpt"
    DynamicEmbDump(path, module, optim=True)
    previous, committed = contents(module), committed_dump(path)
    train(module, torch.arange(0, 900))
    monkeypatch.setattr(manifest_module, "open", _FullAfter(100), raising=False)
    with pytest.raises(OSError, match=r"writing .*ckpt/manifest.json.tmp failed"):
        DynamicEmbDump(path, module, optim=True, allow_overwrite=True)
    assert _dump_dirs(path) == [committed]
    assert not (path / "manifest.json.tmp").exists()
    assert _loads(path, previous)


@pytest.fixture
def small_filesystem(tmp_path):
    """A 4 MiB tmpfs mounted for the test (needs the right to mount: root in CI)."""
    mount = tmp_path / f"fs-{uuid.uuid4().hex[:6]}"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {done.stderr.strip() or done.returncode}")
    try:
        yield mount
    finally:
        if subprocess.run(["umount", str(mount)], check=False).returncode:
            subprocess.run(["umount", "-l", str(mount)], check=False)  # busy: detach it


def test_a_full_filesystem_fails_one_dump_only(small_filesystem):
    path = small_filesystem / "ckpt"
    small = make_module(dim=8)
    train(small, torch.arange(0, 1000))
    DynamicEmbDump(path, small, optim=True)
    big = make_module(dim=64, capacity=1 << 15)
    train(big, torch.arange(0, 30_000))  # ~2 x 15000 rows of 3 x 64 floats: 23 MB
    with pytest.raises(OSError, match=r"writing .*/dump-[^/]+/[ab]\.r0\.\w+ failed") as e:
        DynamicEmbDump(path, big, optim=True, allow_overwrite=True)
    assert e.value.errno == errno.ENOSPC
    assert _loads(path, contents(small))
    train(small, torch.arange(500, 1500))
    DynamicEmbDump(path, small, optim=True, allow_overwrite=True)  # fits: the space is back
    assert _loads(path, contents(small))
    assert _dump_dirs(path) == [committed_dump(path)]
