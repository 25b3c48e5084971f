"""Rank-side code of tests/shard/test_rules_sharded.py: the two-table model of
tests/support/column_wise_workers.py (column-wise + row-wise, or table-wise +
table-row-wise) with probabilistic admission and a scheduled eviction rule on both tables."""

import torch
from torchrec.distributed.sharding_plan import table_row_wise, table_wise

from dynemb import EvictionRule, ProbabilisticAdmissionStrategy, erase_stale
from tests.support.column_wise_workers import BATCH, CW_DIM, FEATURES, RW_DIM, Case, build_model
from tests.support.sharded_workers import dynamic_tables
from tests.support.table_wise_workers import STEPS, entries, global_batch, local_kjt, out_grad


def train_with_rules(rank: int, world_size: int, layout: str = "cw+rw"):
    """STEPS training steps, then a rule on demand over the model. Returns this rank's
    tables' entries after training, the on-demand counts, and the entries after it.
    ``layout`` "tw+twrw": table "cw" whole on the last rank, "rw" table-row-wise over the
    one node of all ranks."""
    per_param = None
    if layout == "tw+twrw":
        per_param = {
            "cw": table_wise(rank=world_size - 1, compute_kernel="customized_kernel"),
            "rw": table_row_wise(host_index=0),
        }
    model = build_model(
        Case("EXACT_SGD", "SUM"), world_size, per_param,
        admit_strategy=ProbabilisticAdmissionStrategy(0.5, seed=4),
        eviction_rule=EvictionRule(max_idle_steps=2, every_n_steps=3, buckets_per_step=1),
    )  # fmt: skip
    for step in range(STEPS):
        lengths, keys = global_batch(step, BATCH * world_size, len(FEATURES))
        out = model(local_kjt(lengths, keys, rank * BATCH, (rank + 1) * BATCH)).to_dict()
        values = torch.cat([out[f] for f in FEATURES], dim=1)
        grad = out_grad(step, BATCH * world_size, CW_DIM + RW_DIM)
        (values * grad[rank * BATCH : (rank + 1) * BATCH]).sum().backward()
    trained = {name: entries(t) for name, t in dynamic_tables(model).items()}
    counts = erase_stale(model, EvictionRule(max_idle_steps=1))
    after = {name: entries(t) for name, t in dynamic_tables(model).items()}
    return trained, counts, after
