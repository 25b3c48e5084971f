"""Process CPU time per key of upserts into a table that does not grow: new keys up to
a load factor, then keys already stored, in batches (W-memory's table: dim 16, buckets
of 128, NO_EVICTION unless ``--strategy`` says otherwise); then finds of stored keys and
of absent ones. Growth, whose page faults dominate ``bench_memory.py``'s insert rate,
is left out: this is the probe's own cost. Compare two commits by running this script
in each tree (it imports the package from ``PYTHONPATH``), alternately, on one host.

Usage::

    PYTHONPATH=. python benchmark/count_upsert_cpu.py [--slots 16M] [--load 0.8]
        [--strategy NO_EVICTION] [--op assign]

``--op``: what the upserts are: ``assign`` (``insert_or_assign`` of zero rows) or
``slots``, the module's training lookup (``find_or_insert_slots_grouped`` of distinct
keys, rows initialised: the de-duplicated batches of ``BatchedDynamicEmbeddingTables``).

Output: JSON lines on stdout (``common.Recorder``), a table on stderr.
"""

import argparse
import time

import torch
from common import Recorder, commit_hash, set_threads

import dynemb
from dynemb import DynamicEmbScoreStrategy
from dynemb.table.growth import find_or_insert_slots_grouped

DIM = 16
BUCKET_CAPACITY = 128
BATCH = 2**18  # keys per upsert (at most 1/16 of the slots)
ASSIGNED = 2**22  # stored keys upserted again, drawn among those inserted


def _count(text: str) -> int:
    """'16M' -> 16 * 2**20, '256K' -> 256 * 2**10, '1000' -> 1000 (an argparse type)."""
    scale = {"K": 2**10, "M": 2**20}.get(text[-1:].upper(), 1)
    try:
        return int(text[:-1] if scale > 1 else text) * scale
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a count such as 4M or 256K, got {text!r}"
        ) from None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--slots", type=_count, default="16M", help="capacity (e.g. 4M, 16M)")
    parser.add_argument("--load", type=float, default=0.8, help="load factor the inserts reach")
    parser.add_argument("--quick", action="store_true", help="256K slots (CI smoke run)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--strategy", default="NO_EVICTION", choices=[s.name for s in DynamicEmbScoreStrategy],
        help="score strategy (an evicting one evicts nothing below capacity)",
    )  # fmt: skip
    parser.add_argument("--op", default="assign", choices=["assign", "slots"],
                        help="insert_or_assign, or the module's distinct-key lookup")  # fmt: skip
    args = parser.parse_args(argv)
    slots = 2**18 if args.quick else args.slots
    if slots < 2 * BUCKET_CAPACITY or slots % BUCKET_CAPACITY:
        parser.error(f"--slots must be a multiple of {BUCKET_CAPACITY} of at least two buckets")
    if not 0 < args.load < 0.95:
        parser.error(f"--load must be in (0, 0.95), got {args.load}")
    if args.threads < 1:
        parser.error(f"--threads must be >= 1, got {args.threads}")
    set_threads(args.threads)
    table = dynemb.ScoredHashTable(
        dim=DIM, capacity=slots, init_capacity=slots, bucket_capacity=BUCKET_CAPACITY,
        score_strategy=DynamicEmbScoreStrategy[args.strategy],
    )  # fmt: skip
    gen = torch.Generator().manual_seed(0)
    batch = min(BATCH, slots // 16)
    n = max(batch, int(slots * args.load) // batch * batch)
    keys = torch.randint(-(2**62), 2**62, (n,), generator=gen)
    values = torch.zeros(batch, DIM)

    def upsert(chunk):
        if args.op == "slots":
            return find_or_insert_slots_grouped([table], [chunk], distinct_keys=True)[0][1]
        return table.insert_or_assign(chunk, values[: chunk.numel()])

    start = time.process_time()
    for i in range(0, n, batch):
        stats = upsert(keys[i : i + batch])
        if stats.failed:
            raise SystemExit(f"{stats.failed} keys failed at load {table.size() / slots:.3f}")
    insert_ns = (time.process_time() - start) * 1e9 / n
    again = keys[torch.randperm(n, generator=gen)[: min(ASSIGNED, n)]]
    start = time.process_time()
    for i in range(0, again.numel(), batch):
        upsert(again[i : i + batch])
    assign_ns = (time.process_time() - start) * 1e9 / again.numel()
    absent = torch.randint(-(2**62), 2**62, (again.numel(),), generator=gen)
    find_ns = {}
    for name, probe in (("stored", again), ("absent", absent)):
        out = torch.empty(batch, DIM)
        start = time.process_time()
        for i in range(0, probe.numel(), batch):
            chunk = probe[i : i + batch]
            table.find(chunk, out=out[: chunk.numel()])
        find_ns[name] = (time.process_time() - start) * 1e9 / probe.numel()
    rec = Recorder(commit_hash())
    variant = (
        f"{slots // 2**20}M@load={args.load:g}" if slots >= 2**20 else f"{slots}@load={args.load:g}"
    )
    impl = f"dynemb.ScoredHashTable {args.strategy}" + (" slots" if args.op == "slots" else "")
    rec.add("W-memory", impl, f"insert_cpu_ns_per_key@{variant}", insert_ns, threads=args.threads)
    rec.add("W-memory", impl, f"assign_stored_cpu_ns_per_key@{variant}", assign_ns,
            threads=args.threads)  # fmt: skip
    for name, ns in find_ns.items():
        rec.add("W-memory", impl, f"find_{name}_cpu_ns_per_key@{variant}", ns, threads=args.threads)
    rec.print_table()


if __name__ == "__main__":
    main()
