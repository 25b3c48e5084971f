"""A tour of one dynamic table: insert on first sight, look up, evict, grow, export.

Run with `make demo` (it sets everything up on first use).
"""

import torch

import dynemb
from dynemb import DynamicEmbScoreStrategy


def main() -> None:
    torch.manual_seed(0)
    print("== a table of dim 4 that evicts by LFU when a bucket is full ==")
    table = dynemb.ScoredHashTable(
        dim=4, capacity=2048, init_capacity=128, score_strategy=DynamicEmbScoreStrategy.LFU
    )
    keys = torch.tensor([42, -7, 2**63 - 1, -(2**63), 0, 42])  # any int64 is a key
    rows = table.find_or_insert(keys)
    print(f"find_or_insert {keys.tolist()}")
    print(f"  -> {table.last_stats.inserted} inserted, {table.last_stats.hits} hit (42 twice)")
    print(f"  row of 42: {rows[0].tolist()}")
    print(f"  scores (access counts): {table.get_scores(keys).tolist()}")

    values, found = table.find(torch.tensor([42, 43]))
    print(
        f"find [42, 43] -> found {found.tolist()}, same row for 42: {torch.equal(values[0], rows[0])}"
    )

    many = torch.randint(-(2**63), 2**63 - 1, (5000,))
    table.find_or_insert(many)
    s = table.last_stats
    print(f"find_or_insert 5000 random keys -> grew to capacity {table.capacity()}")
    print(
        f"  {s.inserted} inserted, {s.evicted} evicted (full buckets at max capacity), {s.failed} failed"
    )
    print(
        f"  size {table.size()}, load factor {table.load_factor():.2f}, {table.memory_usage()} bytes"
    )

    table.insert_or_assign(torch.tensor([42]), torch.ones(1, 4))
    print(f"insert_or_assign 42 := ones -> {table.find(torch.tensor([42]))[0][0].tolist()}")
    print(f"erase [42, -7] -> {table.erase(torch.tensor([42, -7]))} erased")

    exported, offset = 0, 0
    while offset < table.capacity():
        k, v, sc, offset = table.export_batch(offset, 1024)
        exported += k.numel()
    print(f"export_batch visited {exported} live keys (size {table.size()})")


if __name__ == "__main__":
    main()
