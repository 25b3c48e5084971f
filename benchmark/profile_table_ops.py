"""Profiles the hash table's batch ops kernel by kernel (torch.profiler): W-table's table
(2^22 slots, buckets of 128, dim 64 float32, TIMESTAMP), pre-filled with 4 x 2^20 random
keys, then one find, find_or_insert (half resident, half new), insert_or_assign (the
same keys) and erase (2^18 resident keys), each between two synchronisations.

Usage::

    python benchmark/profile_table_ops.py [--device cpu|cuda] [--quick]

Prints torch.profiler's table sorted by device time (CUDA) or CPU time. This is how
the one-thread pass-2 scan and the erase window locks were found on an H100
(DynamicEmb_APIs.md, "Executors", "On a GPU").
"""

import argparse

import torch
from torch.profiler import ProfilerActivity, profile, record_function

import dynemb


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--quick", action="store_true", help="2^16 slots, batches of 2^12")
    args = parser.parse_args()
    device = torch.device(args.device)
    slots, n = (1 << 16, 1 << 12) if args.quick else (1 << 22, 1 << 20)
    gen = torch.Generator(device=device).manual_seed(0)

    def random_keys(count: int) -> torch.Tensor:
        return torch.randint(1, 1 << 62, (count,), device=device, generator=gen)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    table = dynemb.ScoredHashTable(
        dim=64,
        capacity=slots,
        bucket_capacity=128,
        score_strategy=dynemb.DynamicEmbScoreStrategy.TIMESTAMP,
        device=device,
    )
    for _ in range(3):
        table.insert_or_assign(random_keys(n), torch.randn(n, 64, device=device))
    resident = random_keys(n)
    table.insert_or_assign(resident, torch.randn(n, 64, device=device))
    mixed = torch.cat([resident[: n // 2], random_keys(n // 2)])
    rows = torch.randn(n, 64, device=device)
    ops = {
        "find": lambda: table.find(resident),
        "find_or_insert": lambda: table.find_or_insert(mixed),
        "insert_or_assign": lambda: table.insert_or_assign(mixed, rows),
        "erase": lambda: table.erase(resident[n // 4 : n // 2]),
    }
    table.find(resident)  # warm-up: first launches, allocator
    sync()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        for name, op in ops.items():
            with record_function("op:" + name):
                op()
                sync()
    sort = "cuda_time_total" if device.type == "cuda" else "cpu_time_total"
    print(prof.key_averages().table(sort_by=sort, row_limit=25, max_name_column_width=70))


if __name__ == "__main__":
    main()
