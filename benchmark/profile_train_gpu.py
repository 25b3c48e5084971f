"""Where a training step's time goes on a GPU: dynemb's module under torch.profiler.

Usage::

    python benchmark/profile_train_gpu.py [--device cuda|cpu] [--quick] [--workload train|wide]
                                          [--tables N] [--optimizer NAME] [--steps N]
                                          [--out DIR]

Builds bench_train.py's ``BatchedDynamicEmbeddingTables`` (``build_dynemb``: W-train or
W-train-wide, capacity 2x the distinct keys, every row on the device), times ``steps``
steps of ``module(keys, offsets).sum().backward()`` after ``warmup`` (each between two
synchronisations, as bench_train.py), then profiles three more steps with CPU and
device activities. Beside it, in the same run, on the same ids with the same learning
rate and the SAME optimizer, the plain-torch peer: ``nn.EmbeddingBag`` (one per table,
every id a row, ``sparse=True``, SUM pooling), then the optimizer in torch ops on its
sparse gradients: ``torch_rowwise_adagrad.RowwiseAdagrad`` for EXACT_ROWWISE_ADAGRAD
(fbgemm's rule: per distinct row, state += mean(g^2), row -= lr * g / (sqrt(state) +
eps)), ``torch.optim.Adagrad`` for EXACT_ADAGRAD, ``torch.optim.SGD`` for EXACT_SGD;
ADAM has no peer. No TorchRec kernel: fbgemm-gpu's CUDA build need not be installed.

Output: one JSON line per implementation on stdout (with the commit): the median step
(ms), the device's busy time per step (the sum of its kernels and copies), the host's
synchronisations per step (``cudaStreamSynchronize``, ``cudaDeviceSynchronize``,
``cudaEventSynchronize``, ``cudaMemcpy``), the kernel launches per step; the profiler's
tables (top 25 ops by self device time and by self CPU time) on stderr and in ``--out``
as ``profile_gpu_<workload>.txt``. A step far longer than its busy time is bound by the
host: launches, synchronisations and Python. ``--quick`` proves the script runs.
"""

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch
from bench_train import OPTIMIZERS, build_dynemb
from common import add_device_argument, commit_hash, resolve_device, synchronize
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile
from torch_rowwise_adagrad import RowwiseAdagrad
from train_workloads import (
    Config,
    add_workload_arguments,
    fixed_offsets,
    make_batches,
    time_steps,
    workload_config,
)

PROFILED_STEPS = 3
SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")


# The peer's optimizer for each of dynemb's that torch ops give exactly: (name, build).
PEER_OPTIMIZERS = {
    "EXACT_ROWWISE_ADAGRAD": (
        "RowwiseAdagrad(torch ops)",
        lambda params, c: RowwiseAdagrad(params, lr=c.learning_rate, eps=c.eps),
    ),
    "EXACT_ADAGRAD": (
        "torch.optim.Adagrad",
        lambda params, c: torch.optim.Adagrad(params, lr=c.learning_rate, eps=c.eps),
    ),
    "EXACT_SGD": ("torch.optim.SGD", lambda params, c: torch.optim.SGD(params, lr=c.learning_rate)),
}


def peer_impl(config: Config) -> str:
    return f"torch.EmbeddingBag+{PEER_OPTIMIZERS[config.optimizer][0]}"


def torch_peer(config: Config):
    """torch's EmbeddingBag per table (sparse gradients) + ``config.optimizer`` in torch ops
    (PEER_OPTIMIZERS); returns a step over one batch of ids and the batches."""
    device = torch.device(config.device)
    bags = torch.nn.ModuleList(
        torch.nn.EmbeddingBag(config.num_ids, config.dim, mode="sum", sparse=True)
        for _ in range(config.num_tables)
    ).to(device)
    optimizer = PEER_OPTIMIZERS[config.optimizer][1](bags.parameters(), config)
    per_feature = config.batch * config.pooling_factor
    offsets = torch.arange(0, per_feature, config.pooling_factor, device=device)

    def step(ids: torch.Tensor) -> None:
        optimizer.zero_grad(set_to_none=True)
        loss = sum(bag(ids[t * per_feature : (t + 1) * per_feature], offsets).sum()
                   for t, bag in enumerate(bags))  # fmt: skip
        loss.backward()
        optimizer.step()

    return step, [b.to(device) for b in make_batches(config)]


def dynemb_step(config: Config):
    """bench_train.py's dynemb module and step; returns the step and the batches' keys."""
    module, keys, _ = build_dynemb(config)
    offsets = fixed_offsets(config).to(torch.device(config.device))

    def step(batch_keys: torch.Tensor) -> None:
        module(batch_keys, offsets).sum().backward()

    return step, keys


def profile_steps(step, inputs: list, device: torch.device) -> profile:
    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities) as prof:
        for x in inputs:
            step(x)
            synchronize(device)
    return prof


def summary(impl: str, config: Config, times: list[float], prof: profile) -> dict:
    """The JSON line of one implementation (see the module doc)."""
    events = prof.key_averages()
    device_us = sum(e.self_device_time_total for e in events if e.device_type == DeviceType.CUDA)
    kernels = sum(e.count for e in events if e.key in ("cudaLaunchKernel", "cuLaunchKernel"))
    syncs = sum(e.count for e in events if e.key in SYNC_CALLS or e.key.startswith("cudaMemcpy"))
    return {
        "impl": impl,
        "workload": config.workload,
        "optimizer": config.optimizer,
        "device": config.device,
        "tables": config.num_tables,
        "step_ms": 1e3 * statistics.median(times),
        "samples_per_s": config.batch / statistics.median(times),
        "device_busy_ms_per_step": device_us / 1e3 / PROFILED_STEPS,
        "syncs_per_step": syncs / PROFILED_STEPS,
        "launches_per_step": kernels / PROFILED_STEPS,
        "commit": commit_hash(),
    }


def tables_text(prof: profile, device: torch.device) -> str:
    events = prof.key_averages()
    parts = []
    if device.type == "cuda":
        parts.append(events.table(sort_by="self_device_time_total", row_limit=25))
    parts.append(events.table(sort_by="self_cpu_time_total", row_limit=25))
    return "\n".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes, 2 timed steps")
    parser.add_argument("--optimizer", choices=OPTIMIZERS, default="EXACT_ROWWISE_ADAGRAD")
    parser.add_argument("--steps", type=int, help="timed steps (default 20, quick 2)")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "out")
    parser.add_argument("--no-peer", action="store_true", help="dynemb only")
    add_workload_arguments(parser)
    add_device_argument(parser)
    args = parser.parse_args()
    device = resolve_device(args.device)
    args.steps = args.steps or (2 if args.quick else 20)
    base = workload_config(args, optimizer=args.optimizer, device=device.type)
    runs = {"dynemb": (base, dynemb_step)}
    if args.no_peer or base.optimizer not in PEER_OPTIMIZERS:
        print(f"no peer: --no-peer, or no torch-ops peer for {base.optimizer}", file=sys.stderr)
    else:
        runs[peer_impl(base)] = (base, torch_peer)  # the same ids, optimizer and rate
    text = []
    for impl, (config, build) in runs.items():
        step, inputs = build(config)
        times = time_steps(step, inputs, config.warmup, f"{impl} {config.optimizer}", device)
        prof = profile_steps(step, inputs[-PROFILED_STEPS:], device)
        print(json.dumps(summary(impl, config, times, prof)), flush=True)
        text.append(f"== {impl} {config.workload} {config.optimizer} on {device.type}\n")
        text.append(tables_text(prof, device))
        del step, inputs
        if device.type == "cuda":
            torch.cuda.empty_cache()
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"profile_gpu_{base.workload}.txt"
    path.write_text("\n".join(text))
    print("\n".join(text), file=sys.stderr)


if __name__ == "__main__":
    main()
