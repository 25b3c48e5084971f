"""A checkpoint's or a delta's JSON nested deeper than any dynemb writes is refused as a
CheckpointError naming the file, never a RecursionError."""

import json

import pytest
import torch

from dynemb import (
    BatchedDynamicEmbeddingTables,
    CheckpointError,
    DynamicEmbDump,
    DynamicEmbLoad,
    DynamicEmbTableOptions,
)
from dynemb.dump_files.json_files import MAX_DEPTH, parse_json

pytestmark = pytest.mark.no_emulated_pass("JSON parsing: Python only")


def _module():
    options = DynamicEmbTableOptions(dim=4, max_capacity=256)
    return BatchedDynamicEmbeddingTables([options], [0], table_names=["t"])


def _nested(levels: int) -> str:
    return "[" * levels + "]" * levels


def _with_extra(path, text: str) -> None:
    """Adds a field holding ``text`` to the JSON object in ``path``."""
    body = path.read_text().rstrip()
    assert body.endswith("}")
    path.write_text(body[:-1] + f', "extra": {text}}}')


@pytest.mark.parametrize("levels", [100_000, MAX_DEPTH + 1])
def test_a_deeply_nested_manifest_is_a_checkpoint_error(tmp_path, levels):
    module = _module()
    module(torch.tensor([1, 2]), torch.tensor([0, 1, 2])).sum().backward()
    DynamicEmbDump(tmp_path / "ckpt", module)
    manifest = tmp_path / "ckpt" / "manifest.json"
    _with_extra(manifest, _nested(levels))
    before = module.tables[0].size()
    with pytest.raises(CheckpointError, match=r"manifest.json: JSON nested deeper than 32"):
        DynamicEmbLoad(tmp_path / "ckpt", module)
    assert module.tables[0].size() == before


def test_a_deeply_nested_opt_args_is_named(tmp_path):
    module = _module()
    module(torch.tensor([1, 2]), torch.tensor([0, 1, 2])).sum().backward()
    DynamicEmbDump(tmp_path / "ckpt", module, format="dynamicemb")
    (opt_args,) = (tmp_path / "ckpt").rglob("*opt_args.json")
    _with_extra(opt_args, _nested(100_000))
    with pytest.raises(CheckpointError, match=r"opt_args.json: JSON nested deeper than 32"):
        DynamicEmbLoad(tmp_path / "ckpt", module)


def test_what_dynemb_writes_parses(tmp_path):
    document = {"a": [{"b": [1, 2, {"c": [[]]}]}]}
    assert parse_json(json.dumps(document), tmp_path / "x.json") == document
    assert parse_json(_nested(MAX_DEPTH), tmp_path / "x.json") is not None


def test_a_deeply_nested_delta_manifest_is_a_checkpoint_error(tmp_path):
    from dynemb.deltas.format import read_delta

    delta = tmp_path / "delta-00000001"
    delta.mkdir()
    (delta / "manifest.json").write_text('{"format": ' + _nested(100_000) + "}")
    with pytest.raises(CheckpointError, match=r"manifest.json: JSON nested deeper than 32"):
        read_delta(delta)
