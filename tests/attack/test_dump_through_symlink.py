"""A dump directory given as a symbolic link is resolved once, when the dump starts,
and every file goes inside the directory it led to then: a link moved during the dump
sends nothing (neither the rest of the dump nor its commit) to the link's new target."""

import pytest
import torch

import dynemb.checkpoint.writer as dump_module
from dynemb import (
    BatchedDynamicEmbeddingTables,
    DynamicEmbDump,
    DynamicEmbLoad,
    DynamicEmbTableOptions,
)

pytestmark = pytest.mark.no_emulated_pass("dump directory resolution: Python file handling")

KEYS = torch.arange(1, 17)


def _module():
    options = DynamicEmbTableOptions(dim=4, max_capacity=256)
    return BatchedDynamicEmbeddingTables([options], [0], table_names=["t"])


def _rows(module):
    return module(KEYS, torch.arange(KEYS.numel() + 1))


# the function of writer.py that writes a table's files, per layout
@pytest.mark.parametrize(
    "layout, writer", [("dynemb", "_write_table"), ("dynamicemb", "write_table")]
)
def test_a_link_moved_during_the_dump_does_not_redirect_it(tmp_path, monkeypatch, layout, writer):
    real, elsewhere, link = tmp_path / "real", tmp_path / "elsewhere", tmp_path / "link"
    real.mkdir()
    elsewhere.mkdir()
    link.symlink_to(real)
    trained = _module()
    _rows(trained).sum().backward()
    original = getattr(dump_module, writer)

    def move_the_link_then_write(*args, **kwargs):
        link.unlink()
        link.symlink_to(elsewhere)
        return original(*args, **kwargs)

    monkeypatch.setattr(dump_module, writer, move_the_link_then_write)
    assert DynamicEmbDump(link, trained, format=layout) == link
    assert list(elsewhere.iterdir()) == []
    loaded = _module()
    DynamicEmbLoad(real, loaded)
    trained.eval(), loaded.eval()
    assert torch.equal(_rows(loaded), _rows(trained))


def test_a_link_is_followed_to_its_directory(tmp_path):
    real, link = tmp_path / "real", tmp_path / "link"
    real.mkdir()
    link.symlink_to(real)
    trained = _module()
    _rows(trained).sum().backward()
    DynamicEmbDump(link, trained)
    assert (real / "manifest.json").is_file() and link.is_symlink()
    loaded = _module()
    DynamicEmbLoad(link, loaded)
    assert loaded.tables[0].size() == KEYS.numel()
