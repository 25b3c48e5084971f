"""DYNAMICEMB_API.md section 13: ``dist_type="hash_roundrobin"`` sends key k to rank
``fmix64(uint64(k)) % world_size`` (MurmurHash3's finaliser, unsalted); a rank's keys
still spread over all its buckets; checkpoints of the earlier (salted) routing load,
each key re-routed to its owner."""

import pytest
import torch

from dynemb import _ops
from dynemb.distributed.routing import route_keys
from tests.support.hash_roundrobin_workers import (
    dump_old_routing,
    load_new_routing,
    old_owner,
    saved_keys,
)
from tests.support.multiprocess import run_ranks

pytestmark = pytest.mark.no_emulated_pass(
    "a routing rule over spawned gloo ranks: the key hash is tested per executor in test_hash_keys.py"
)

_MASK = (1 << 64) - 1


def dynamicemb_rank(key: int, world_size: int) -> int:
    """Section 13's formula, on Python ints."""
    k = key & _MASK
    k ^= k >> 33
    k = (k * 0xFF51AFD7ED558CCD) & _MASK
    k ^= k >> 33
    k = (k * 0xC4CEB9FE1A85EC53) & _MASK
    k ^= k >> 33
    return k % world_size


EDGE_KEYS = [0, 1, -1, 2, 7, 1 << 40, -(1 << 62), (1 << 63) - 1, -(1 << 63), 123456789]


@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 7, 8, 1000])
def test_owner_is_dynamicembs(world_size):
    keys = EDGE_KEYS + torch.randint(-(1 << 63), (1 << 63) - 1, (2000,)).tolist()
    rank, value = route_keys(torch.tensor(keys), "hash_roundrobin", world_size, 40)
    assert rank.tolist() == [dynamicemb_rank(k, world_size) for k in keys]
    assert value.tolist() == keys  # the key itself is sent


@pytest.mark.parametrize("world_size", [2, 4, 8])
def test_a_ranks_keys_fill_every_bucket(world_size):
    keys = torch.randint(
        -(1 << 62), 1 << 62, (200_000,), generator=torch.Generator().manual_seed(1)
    )
    rank, _ = route_keys(keys, "hash_roundrobin", world_size, 0)
    buckets, _ = _ops.hash_keys(keys[rank == 0].contiguous(), 256)
    counts = torch.bincount(buckets, minlength=256).float()
    assert float(counts.min() / counts.mean()) > 0.6, counts.tolist()
    assert float(counts.max() / counts.mean()) < 1.5, counts.tolist()


@pytest.mark.parametrize("fmt", ["dynemb", "dynamicemb"])
@pytest.mark.parametrize("world_size", [1, 2])
def test_checkpoint_of_the_salted_routing_loads(tmp_path, world_size, fmt):
    path = str(tmp_path / "ckpt")
    run_ranks(dump_old_routing, world_size, path, fmt, timeout=150)
    results = run_ranks(load_new_routing, world_size, path, timeout=150)
    keys = saved_keys()
    if world_size == 2:  # the two routings disagree on about half of the keys
        new, _ = route_keys(keys, "hash_roundrobin", 2, 0)
        assert 0.3 < float((new != old_owner(keys, 2)).float().mean()) < 0.7
    for name in ("t0", "t1"):
        held = []
        for rank, result in enumerate(results):
            got, first_column = result[name]
            owner, _ = route_keys(got, "hash_roundrobin", world_size, 0)
            assert bool((owner == rank).all())
            assert torch.equal(first_column, got.to(torch.float32))
            held += got.tolist()
        assert sorted(held) == sorted(keys.tolist())
