"""Row-wise routing of raw keys (dynemb.distributed.routing): every rule, every key range."""

import pytest
import torch

from dynemb import _ops
from dynemb.distributed.routing import DIST_TYPES, STATIC, check_dist_type, route_keys

EDGE_KEYS = torch.tensor([0, 1, 39, 40, 41, -1, -40, 1 << 40, (1 << 63) - 1, -(1 << 63)])


@pytest.mark.parametrize("dist_type", DIST_TYPES)
@pytest.mark.parametrize("world_size", [1, 2, 3, 5])
def test_every_key_gets_a_rank_and_keeps_its_value(dist_type, world_size):
    keys = torch.cat([EDGE_KEYS, torch.randint(-(1 << 62), 1 << 62, (1000,))])
    rank, value = route_keys(keys, dist_type, world_size, 40)
    assert rank.dtype == torch.int64
    assert bool(((rank >= 0) & (rank < world_size)).all())
    assert torch.equal(value, keys)  # dynamic tables store the raw key
    again, _ = route_keys(keys, dist_type, world_size, 40)
    assert torch.equal(rank, again)


def test_roundrobin_is_floored_modulo():
    rank, _ = route_keys(EDGE_KEYS, "roundrobin", 3, 40)
    assert rank.tolist() == [k % 3 for k in EDGE_KEYS.tolist()]


def test_continuous_blocks_in_range_and_modulo_outside():
    # num_embeddings 40 over 3 ranks: blocks of 14 rows; outside [0, 40): key mod 3.
    keys = torch.tensor([0, 13, 14, 27, 28, 39, 40, 41, 42, -1, 1 << 40])
    rank, _ = route_keys(keys, "continuous", 3, 40)
    want = [0, 0, 1, 1, 2, 2, 40 % 3, 41 % 3, 42 % 3, -1 % 3, (1 << 40) % 3]
    assert rank.tolist() == want


def test_static_tables_keep_torchrec_block_routing_and_local_rows():
    keys = torch.tensor([0, 13, 14, 39])
    rank, local = route_keys(keys, STATIC, 3, 40)
    assert rank.tolist() == [0, 0, 1, 2]
    assert local.tolist() == [0, 13, 0, 11]


@pytest.mark.parametrize("world_size", [2, 3, 4, 8])
def test_hash_roundrobin_spreads_patterned_keys(world_size):
    keys = torch.arange(100_000, dtype=torch.int64) * world_size  # all on rank 0 by roundrobin
    rr, _ = route_keys(keys, "roundrobin", world_size, 0)
    assert int(rr.max()) == 0
    rank, _ = route_keys(keys, "hash_roundrobin", world_size, 0)
    counts = torch.bincount(rank, minlength=world_size).float()
    assert float(counts.max() / counts.mean()) <= 1.3, counts.tolist()


def test_hash_routing_is_independent_of_the_table_bucket_hash():
    # If routing used the table's own hash bits, a rank's keys would fill only
    # 1/world_size of its buckets. Keys of rank 0 must spread over every bucket.
    keys = torch.randint(-(1 << 62), 1 << 62, (200_000,))
    rank, _ = route_keys(keys, "hash_roundrobin", 4, 0)
    mine = keys[rank == 0].contiguous()
    buckets, _ = _ops.hash_keys(mine, 64)
    counts = torch.bincount(buckets, minlength=64).float()
    assert float(counts.min() / counts.mean()) > 0.8, counts.tolist()


def test_unknown_dist_type_is_a_clear_error():
    with pytest.raises(
        ValueError, match="dist_type must be one of continuous, roundrobin, hash_roundrobin"
    ):
        check_dist_type("t0", "random")
