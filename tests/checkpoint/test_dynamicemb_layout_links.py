"""DynamicEmb's layout with symbolic links: a dangling, looping or escaping link in place
of a saved file is refused by name (a CheckpointError, not an OSError or a read of a file
outside the checkpoint), before any table changes."""

import pytest
import torch

from dynemb.checkpoint import CheckpointError, DynamicEmbDump, DynamicEmbLoad
from tests.support.checkpoint_tables import contents, make_module, same, train

pytestmark = pytest.mark.no_emulated_pass("file format: no table op differs per executor")

KEYS = "a_emb_keys.rank_0.world_size_1"
VALUES = "a_emb_values.rank_0.world_size_1"


@pytest.fixture
def saved(tmp_path):
    module = make_module(dim=4, capacity=256)
    train(module, torch.arange(-20, 20))
    path = tmp_path / "ckpt"
    DynamicEmbDump(path, module, optim=True, format="dynamicemb")
    return path / "model"


def _refused(path, match: str) -> None:
    module = make_module(dim=4, capacity=256)
    train(module, torch.arange(1000, 1010))
    before = contents(module)
    with pytest.raises(CheckpointError, match=match):
        DynamicEmbLoad(path.parent, module, optim=True)
    assert same(contents(module), before), "a refused load changed the tables"


@pytest.mark.parametrize("name", [KEYS, VALUES, "a_opt_args.json"])
def test_dangling_link_is_named(saved, name):
    (saved / name).unlink()
    (saved / name).symlink_to(saved / "no-such-file")
    _refused(saved, rf"{name}: a dangling symbolic link")


@pytest.mark.parametrize("name", [KEYS, VALUES, "a_opt_args.json"])
def test_looping_link_is_named(saved, name):
    (saved / name).unlink()
    (saved / name).symlink_to(saved / name)
    _refused(saved, rf"{name}: cannot be resolved")


def test_link_out_of_the_checkpoint_is_refused(saved, tmp_path):
    outside = tmp_path / "elsewhere"
    outside.write_bytes((saved / VALUES).read_bytes())  # the right size: only the place is wrong
    (saved / VALUES).unlink()
    (saved / VALUES).symlink_to(outside)
    _refused(saved, rf"{VALUES}: leads to .*elsewhere, outside the checkpoint directory")
