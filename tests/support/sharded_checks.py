"""Checks of a sharded training run against the unsharded reference: every rank's
outputs, step by step, and each key held by exactly its owner with the reference's row."""

import torch

from dynemb.distributed.routing import route_keys
from tests.support.sharded_workers import (
    FEATURES,
    NUM_EMBEDDINGS,
    STEPS,
    train_reference,
)

ATOL = 1e-5


def check_sharded_training(cases, batch_sizes, results):
    world_size = len(batch_sizes)
    starts = [sum(batch_sizes[:r]) for r in range(world_size)]
    for c, case in enumerate(cases):
        reference, ref_outputs = train_reference(case, batch_sizes, world_size)
        for rank in range(world_size):
            outputs, keys, rows = results[rank][c]
            a, b = starts[rank], starts[rank] + batch_sizes[rank]
            for step in range(STEPS):
                got, want = outputs[step], ref_outputs[step]
                if case.pooling == "NONE":
                    want = sequence_slice(case, step, want, batch_sizes, a, b)
                    for f, name in enumerate(FEATURES):
                        torch.testing.assert_close(
                            got[f],
                            want[f],
                            atol=ATOL,
                            rtol=0,
                            msg=lambda m, case=case, rank=rank, step=step, name=name: (
                                f"{case} rank {rank} step {step} {name}: {m}"
                            ),
                        )
                else:
                    torch.testing.assert_close(
                        got,
                        want[a:b],
                        atol=ATOL,
                        rtol=0,
                        msg=lambda m, case=case, rank=rank, step=step: (
                            f"{case} rank {rank} step {step}: {m}"
                        ),
                    )
        check_rows_held_by_owners(case, reference, [results[r][c] for r in range(world_size)])


def sequence_slice(case, step, out, batch_sizes, a, b):
    from tests.support.sharded_workers import global_batch

    lengths, _, _ = global_batch(step, sum(batch_sizes), case.weighted)
    per_feature = lengths.sum(1).tolist()
    chunks = torch.split(out, per_feature)
    return [
        chunks[f][int(lengths[f, :a].sum()) : int(lengths[f, :b].sum())]
        for f in range(len(FEATURES))
    ]


def check_rows_held_by_owners(case, reference, rank_results):
    """Each key is held by exactly its owner, with the reference's trained row."""
    world_size = len(rank_results)
    keys = rank_results[0][1]
    for t, name in enumerate(["t0", "t1"]):
        want_rows, want_found = reference.tables[t].find(keys)
        owner, _ = route_keys(keys, case.dist_type, world_size, NUM_EMBEDDINGS)
        held = torch.zeros(keys.numel(), dtype=torch.int64)
        for rank, (_, rank_keys, rows) in enumerate(rank_results):
            assert torch.equal(rank_keys, keys)
            values, found = rows[name]
            assert torch.equal(found, found & (owner == rank)), (
                f"{case} {name}: a key on a non-owner rank {rank}"
            )
            held += found.long()
            torch.testing.assert_close(values[found], want_rows[found], atol=ATOL, rtol=0)
        assert torch.equal(held.bool(), want_found), f"{case} {name}: keys lost or invented"
        assert bool((held <= 1).all())
