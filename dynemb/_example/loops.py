"""The example's training and evaluation loops over a DMP model, and its checkpoints."""

import argparse
import os
import sys
from collections.abc import Callable, Iterable

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F
from torch import nn
from torchrec.datasets.utils import Batch
from tqdm import tqdm

from dynemb.checkpoint.load import DynamicEmbLoad
from dynemb.checkpoint.writer import DynamicEmbDump
from dynemb.datasets import roc_auc
from dynemb.tiering import PrefetchPipeline, distribute_for_prefetch, prefetch_distributed


def train_epoch(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    batches: Iterable[Batch],
    device: torch.device,
    desc: str,
    progress: bool,
    prefetch: bool = False,
    after_step: Callable[[], None] | None = None,
) -> float:
    """One pass over ``batches``; returns the mean training loss over all ranks.

    ``prefetch``: run dynemb.tiering.PrefetchPipeline (caching mode), which overlaps
    the prefetch of each next batch with the training of the current one.
    ``after_step``: called after each optimizer step (a batch boundary).
    """
    model.train()
    total = torch.zeros(2, dtype=torch.float64)  # loss sum, samples
    bar = tqdm(batches, desc=desc, unit="batch", disable=not progress, file=sys.stderr)

    def step(batch: Batch) -> torch.Tensor:
        batch = batch.to(device)
        logits = model(batch.dense_features, batch.sparse_features)
        loss = F.binary_cross_entropy_with_logits(logits, batch.labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if after_step is not None:
            after_step()
        return torch.tensor([loss.item() * len(batch.labels), len(batch.labels)])

    if prefetch:
        steps = PrefetchPipeline(bar, step, prefetch_distributed, distribute_batch(model, device))
    else:
        steps = map(step, bar)
    for done in steps:
        total += done
        bar.set_postfix(loss=f"{total[0] / total[1]:.4f}", refresh=False)
    dist.all_reduce(total)
    return float(total[0] / total[1])


def distribute_batch(model: nn.Module, device: torch.device):
    """--prefetch: a batch's input dist to each sharded collection of the SequenceDLRM."""
    dlrm = model.module

    def distribute(batch: Batch) -> list:
        pooled, sequences = dlrm.split_features(batch.to(device).sparse_features)
        parts = [(dlrm.embedding_bag_collection, pooled)]
        if dlrm.embedding_collection is not None:
            parts.append((dlrm.embedding_collection, sequences))
        return [distribute_for_prefetch(module, features) for module, features in parts]

    return distribute


@torch.no_grad()
def evaluate(
    model: nn.Module, batches: Iterable[Batch], device: torch.device, desc: str, progress: bool
) -> float:
    """Held-out AUC over all ranks' predictions (gathered, then ranked)."""
    return evaluate_logits(model, batches, device, desc, progress)[0]


@torch.no_grad()
def evaluate_logits(
    model: nn.Module, batches: Iterable[Batch], device: torch.device, desc: str, progress: bool
) -> tuple[float, torch.Tensor]:
    """``evaluate``'s AUC, and the logits it ranked (rank 0's batches, then rank 1's, ...)."""
    model.eval()
    scores, labels = [], []
    for batch in tqdm(batches, desc=desc, unit="batch", disable=not progress, file=sys.stderr):
        batch = batch.to(device)
        scores.append(model(batch.dense_features, batch.sparse_features).float().cpu())
        labels.append(batch.labels.cpu())
    local = torch.stack([torch.cat(scores), torch.cat(labels)])  # same size on every rank
    gathered = [torch.empty_like(local) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, local)
    everything = torch.cat(gathered, dim=1)
    return roc_auc(everything[0], everything[1]), everything[0]


def load_checkpoint(model: nn.Module, args: argparse.Namespace) -> None:
    """Dynamic tables from dynemb's checkpoint (any world size), the rest (dense layers,
    ordinary TorchRec tables) from torch.distributed.checkpoint."""
    DynamicEmbLoad(os.path.join(args.checkpoint_dir, "dynamic"), model, optim=True)
    state = model.state_dict()
    dcp.load(state, checkpoint_id=os.path.join(args.checkpoint_dir, "torchrec"))
    model.load_state_dict(state, strict=False)


def dump_checkpoint(model: nn.Module, args: argparse.Namespace) -> None:
    DynamicEmbDump(
        os.path.join(args.checkpoint_dir, "dynamic"), model, optim=True, allow_overwrite=True
    )
    dcp.save(model.state_dict(), checkpoint_id=os.path.join(args.checkpoint_dir, "torchrec"))
