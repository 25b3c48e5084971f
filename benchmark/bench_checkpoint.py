"""Checkpoint throughput: DynamicEmbDump / DynamicEmbLoad against the disk's raw speed.

Usage::

    python benchmark/bench_checkpoint.py [--quick] [--keys N] [--dir DIR]

A table of 4M keys, dim 64, with Adam state (128 more columns), float32, in one
process: ``DynamicEmbDump(optim=True)`` and ``DynamicEmbLoad(optim=True)`` into a fresh
module. Peer in the same run: a raw sequential write (64 MiB chunks, then fsync) and
read of as many bytes in one file on the same disk. Before each read (raw or load)
the files are dropped from the page cache (``posix_fadvise(DONTNEED)``), so reads
come from the disk as far as the kernel allows. Throughput is MB/s of checkpoint
bytes; the target (WORKLOADS.md) is at least 50% of the raw speed.
"""

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch
from common import Recorder, available_threads, commit_hash, set_threads

import dynemb
from dynemb.optimizer import EmbOptimType

WORKLOAD = "W-checkpoint"
CHUNK = 64 << 20


def build(keys: int, dim: int, fill: bool) -> dynemb.BatchedDynamicEmbeddingTables:
    options = dynemb.DynamicEmbTableOptions(dim=dim, max_capacity=keys * 5 // 4 + 1024)
    module = dynemb.BatchedDynamicEmbeddingTables(
        [options], [0], optimizer=EmbOptimType.ADAM, table_names=["t"]
    )
    if fill:
        table = module.tables[0]
        g = torch.Generator().manual_seed(0)
        width = dim + module.optimizer_config.state_columns(dim)
        for start in range(0, keys, 1 << 20):
            n = min(1 << 20, keys - start)
            ids = torch.randint(-(1 << 62), 1 << 62, (n,), generator=g)
            table.insert_or_assign(ids, torch.randn(n, width, generator=g))
    return module


def drop_cache(path: Path) -> None:
    for file in [path] if path.is_file() else path.rglob("*"):
        if file.is_file():
            fd = os.open(file, os.O_RDONLY)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)


def raw_write_read(file: Path, nbytes: int) -> tuple[float, float]:
    block = os.urandom(1 << 20) * (CHUNK >> 20)
    start = time.perf_counter()
    with open(file, "wb") as f:
        written = 0
        while written < nbytes:
            f.write(block[: min(CHUNK, nbytes - written)])
            written += min(CHUNK, nbytes - written)
        f.flush()
        os.fsync(f.fileno())
    write_s = time.perf_counter() - start
    drop_cache(file)
    start = time.perf_counter()
    with open(file, "rb") as f:
        while f.read(CHUNK):
            pass
    return write_s, time.perf_counter() - start


def checkpoint_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="64k keys (CI smoke run)")
    parser.add_argument("--keys", type=int, default=4 << 20)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--dir", help="where to write (default: a temporary directory)")
    parser.add_argument("--threads", type=int, default=available_threads())
    args = parser.parse_args(argv)
    keys = 1 << 16 if args.quick else args.keys
    threads = set_threads(args.threads)
    root = Path(tempfile.mkdtemp(prefix="dynemb-bench-", dir=args.dir))
    rec = Recorder(commit_hash())
    try:
        print(f"filling {keys} keys, dim {args.dim}, Adam state ...", file=sys.stderr)
        module = build(keys, args.dim, fill=True)
        path = root / "ckpt"
        start = time.perf_counter()
        dynemb.DynamicEmbDump(path, module, optim=True)
        dump_s = time.perf_counter() - start
        nbytes = checkpoint_bytes(path)
        size = module.tables[0].size()  # a full bucket may have evicted a few keys
        del module
        target = build(keys, args.dim, fill=False)
        drop_cache(path)
        start = time.perf_counter()
        dynemb.DynamicEmbLoad(path, target, optim=True)
        load_s = time.perf_counter() - start
        assert target.tables[0].size() == size, "the load lost keys"
        raw_w, raw_r = raw_write_read(root / "raw.bin", nbytes)
        mb = nbytes / 1e6
        print(f"checkpoint: {mb:.0f} MB", file=sys.stderr)
        rec.add(WORKLOAD, "raw.sequential", "write_MBps", mb / raw_w, threads=threads)
        rec.add(WORKLOAD, "raw.sequential", "read_MBps", mb / raw_r, threads=threads)
        rec.add(WORKLOAD, "dynemb.DynamicEmbDump", "write_MBps", mb / dump_s, threads=threads,
                peer="raw.sequential", peer_value=mb / raw_w)  # fmt: skip
        rec.add(WORKLOAD, "dynemb.DynamicEmbLoad", "read_MBps", mb / load_s, threads=threads,
                peer="raw.sequential", peer_value=mb / raw_r)  # fmt: skip
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(file=sys.stderr)
    rec.print_table(sys.stderr)


if __name__ == "__main__":
    main()
