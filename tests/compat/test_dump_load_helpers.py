"""DYNAMICEMB_API.md section 13: dynemb.dump_load's find_sharded_modules and
get_dynamic_emb_module on a sharded model, over 1 and 2 gloo ranks."""

import pytest

from tests.support.dump_load_workers import helpers
from tests.support.multiprocess import run_ranks


@pytest.mark.no_emulated_pass("module discovery runs no table op")
@pytest.mark.parametrize("world_size", [1, 2])
def test_find_sharded_modules_and_dynamic_modules(world_size):
    for result in run_ranks(helpers, world_size, timeout=150):
        # DMP's wrapper level is not part of a path: the collection is the model itself.
        assert result["found"] == [("model", "model", True)]
        assert result["nested"] == [("model.sparse.ebc", "ebc", True)]
        assert result["prefixed"] == [("net.sparse.ebc", "ebc")]
        assert result["modules"] == [(True, ["t0", "t1"])]
        assert result["plain"] == []
