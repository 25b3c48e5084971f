"""``example.py --stats``: every rank's dynamic tables' telemetry, printed by the lead
rank (each rank holds a row-wise shard of every table: its own counts)."""

import torch.distributed as dist
import torch.nn as nn

from dynemb.telemetry import format_summary, table_telemetry


def sample_every_step(model: nn.Module) -> None:
    """Makes every table record the evicted keys of every step (the example's tables
    are small; a large model samples every ``sample_every`` steps, 100 by default)."""
    for telemetry in table_telemetry(model).values():
        telemetry.configure(sample_every=1)


def print_stats(model: nn.Module, title: str, lead: bool) -> None:
    """Gathers every rank's ``format_summary`` of its tables (a collective: every rank
    calls it) and prints them on the lead rank, under ``title``."""
    summary = format_summary(table_telemetry(model))
    summaries = [None] * dist.get_world_size()
    dist.all_gather_object(summaries, summary)
    if lead:
        for rank, text in enumerate(summaries):
            print(f"{title}, rank {rank} telemetry:\n{text}", flush=True)


__all__ = ["print_stats", "sample_every_step"]
