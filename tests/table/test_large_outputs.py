"""Batches whose output is larger than a cache (the CPU executor streams it) return the same rows.

The CPU executor writes a find / find_or_insert output of more than 32 MiB with
non-temporal stores (csrc/cpu/executor_cpu.cpp); these batches cross that size.
"""

import pytest
import torch

import dynemb

pytestmark = pytest.mark.no_emulated_pass(
    "the CPU executor's streamed stores are under test; the emulated kernels write rows "
    "of a large batch as of any other, which the parity suite holds"
)

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


def _full_rows(table: dynemb.ScoredHashTable, keys: torch.Tensor) -> torch.Tensor:
    """(n, dim + extra_columns): the stored rows of keys, extra columns included."""
    exported, rows, _, _ = table.export_batch(0, table.capacity(), include_extra=True)
    order = torch.argsort(exported)
    pos = torch.searchsorted(exported[order], keys)
    assert torch.equal(exported[order][pos], keys)
    return rows[order][pos]


@pytest.mark.parametrize("extra_columns", [0, 16])
def test_large_batches_write_whole_table_rows(extra_columns):
    """Large batches stream whole table rows (new rows, assigned rows): the table
    holds exactly what a small batch, whose rows are not streamed, would store."""
    gen = torch.Generator().manual_seed(1)
    width = DIM + extra_columns

    def make() -> dynemb.ScoredHashTable:
        return dynemb.ScoredHashTable(
            dim=DIM, capacity=2**19, extra_columns=extra_columns, extra_init=0.5, seed=3
        )

    keys = torch.arange(2 * N) * 0x1E3779B97F4A7C15
    stored, new = keys[:N], keys[N:]
    large, small = make(), make()
    full = torch.randn(N, width, generator=gen)
    large.insert_or_assign(stored, full)  # new keys, whole rows given
    for part in torch.split(torch.arange(N), 4096):
        small.insert_or_assign(stored[part], full[part])
    assert torch.equal(_full_rows(large, stored), full)

    again = torch.randn(N, width, generator=gen)
    large.insert_or_assign(stored, again)  # hits, whole rows overwritten
    assert torch.equal(_full_rows(large, stored), again)
    small.insert_or_assign(stored, again)

    mixed = torch.cat([stored[: N // 2], new[: N // 2]])
    got = large.find_or_insert(mixed)  # new rows initialised
    expected = torch.cat(
        [small.find_or_insert(mixed[p]) for p in torch.split(torch.arange(N), 4096)]
    )
    assert torch.equal(got, expected)
    assert torch.equal(_full_rows(large, mixed), _full_rows(small, mixed))
