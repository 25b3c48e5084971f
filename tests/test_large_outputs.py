"""Batches whose output is larger than a cache (the CPU executor streams it) return the same rows.

The CPU executor writes a find / find_or_insert output of more than 32 MiB with
non-temporal stores (csrc/cpu/executor_cpu.cpp); these batches cross that size.
"""

import torch

import dynemb

DIM = 64
N = 160_000  # 160k rows x 64 float32 = 39 MiB of output


def test_large_find_and_find_or_insert_return_stored_rows():
    gen = torch.Generator().manual_seed(0)
    table = dynemb.ScoredHashTable(dim=DIM, capacity=2**19)
    keys = torch.arange(2 * N) * 0x1E3779B97F4A7C15  # odd multiplier: distinct keys
    stored, new = keys[:N], keys[N:]
    values = torch.randn(N, DIM, generator=gen)
    table.insert_or_assign(stored, values)

    rows, found = table.find(stored)
    assert bool(found.all())
    assert torch.equal(rows, values)

    mixed = torch.cat([stored[: N // 2], new[: N // 2]])
    got = table.find_or_insert(mixed)
    assert torch.equal(got[: N // 2], values[: N // 2])
    again, found = table.find(mixed)
    assert bool(found.all())
    assert torch.equal(got, again)
