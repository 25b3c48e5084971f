"""Kernel launches and memsets per table op and per training step, counted on the
emulated CUDA executor: what the same calls launch on a GPU (csrc/emulated counts
every launch and cudaMemsetAsync; dynemb._ops.emulation_counters).

Usage::

    python benchmark/count_launches.py [--quick]

Host-independent: the counts depend on the code, not the machine. Output: a JSON line
per op ({"op", "launches", "memsets"}). Ops: find, find_or_insert (new keys, then
hits) and insert_or_assign on one table of dim 64; a training step (forward, backward
and the fused row-wise Adagrad update) of 8 tables of dim 64, W-train's layout at a
smaller batch.
"""

import argparse
import json
import os

os.environ["DYNEMB_EXECUTOR"] = "cuda-emulated"  # read once, when dynemb is imported

import torch

import dynemb
from dynemb import _ops
from dynemb.optimizer import EmbOptimType
from dynemb.table.scored_hash_table import ScoredHashTable


def counted(call) -> dict[str, int]:
    before = _ops.emulation_counters()
    call()
    after = _ops.emulation_counters()
    return {k: after[k] - before[k] for k in ("launches", "memsets")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller batches")
    args = parser.parse_args()
    n, batch = (1 << 10, 64) if args.quick else (1 << 14, 512)
    gen = torch.Generator().manual_seed(0)
    table = ScoredHashTable(dim=64, capacity=4 * n)
    keys = torch.randint(0, 2**62, (n,), generator=gen)
    rows = torch.randn(n, 64, generator=gen)
    ops = {
        "find_or_insert (new keys)": lambda: table.find_or_insert(keys),
        "find_or_insert (hits)": lambda: table.find_or_insert(keys),
        "find": lambda: table.find(keys),
        "insert_or_assign": lambda: table.insert_or_assign(keys, rows),
    }
    module = dynemb.BatchedDynamicEmbeddingTables(
        table_options=[dynemb.DynamicEmbTableOptions(dim=64, max_capacity=4 * n) for _ in range(8)],
        feature_table_map=list(range(8)),
        pooling_mode=dynemb.DynamicEmbPoolingMode.SUM,
        optimizer=EmbOptimType.EXACT_ROWWISE_ADAGRAD,
        learning_rate=0.01,
    )
    pooling = 16
    offsets = torch.arange(0, 8 * batch * pooling + 1, pooling)

    def step() -> None:
        ids = torch.randint(0, 2 * n, (8 * batch * pooling,), generator=gen)
        module(ids, offsets).sum().backward()

    step()  # the first step also sizes workspaces
    ops["training step (8 tables)"] = step
    for name, call in ops.items():
        print(json.dumps({"op": name, **counted(call)}), flush=True)


if __name__ == "__main__":
    main()
