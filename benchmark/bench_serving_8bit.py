"""8-bit serving tables on W-quality's served model: held-out AUC, memory per key and
lookup throughput of int8 and e4m3 rows beside float32 rows, in one run.

Usage::

    python benchmark/bench_serving_8bit.py [--quick] [--threads N] [--repeats R]

What it runs: ``example.py --train --eval --publish_every K`` at W-quality's sizes (the
data, model and one epoch of ``bench_quality.py``: 1M training rows, 100k held out; the
example's dynamic tables publish a base checkpoint and deltas), then for each row format
(float32 as trained, int8, e4m3) ``examples/serve.py --weights_dtype F``: the base and
every delta replayed into the inference modules (8-bit rows quantized as they load and
as each delta applies), the whole model exported with ``torch.export``, saved, loaded and
scored on the held-out rows. Figures:

- ``auc``: the served program's held-out AUC; the peer is the float32 served model of
  the same run (its AUC is the trained model's, bit for bit). Target: within 0.001.
- ``bytes_per_key``: every buffer of the served dynamic tables (hash table and rows)
  over the keys they hold; peer float32.
- ``lookup_keys_per_s``: the pooled inference module alone (6 dynamic tables, mean
  pooling, the held-out batches' keys, eager), keys looked up per second, median of
  ``--repeats`` passes over the held-out set, the formats' passes interleaved; peer
  float32.
- ``pool_keys_per_s``: the pooling op alone (``embedding_pool`` beside
  ``embedding_pool_quantized``) over one served table's rows (f0's) and the held-out
  batches' f0 keys, slots found beforehand: keys pooled per second, median of
  ``--repeats`` interleaved passes; peer float32.
- ``lookup_ratio`` / ``pool_ratio``: the median of the per-pass ratios to float32 (each
  pass beside the float32 pass just before it: steadier than the ratio of the medians
  on a shared host).

Output: JSON lines on stdout (``common.Recorder``), a table on stderr.
"""

import argparse
import functools
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from common import Recorder, available_threads, commit_hash, set_threads

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dynemb import _ops  # noqa: E402
from dynemb._example.data import id_views, make_dataset  # noqa: E402
from dynemb._example.publishing import latest_version, read_config  # noqa: E402
from examples import serve  # noqa: E402

WORKLOAD = "W-quality-served"
FORMATS = ("float32", "int8", "e4m3")
FULL = ["--num_train", "1000000", "--num_eval", "100000", "--capacity", str(1 << 19)]
QUICK = ["--num_train", "20000", "--num_eval", "5000", "--vocab_size", "10000"]
QUICK += ["--capacity", "8192", "--batch_size", "256"]


def train_and_publish(directory: Path, sizes: list[str], threads: int) -> None:
    """example.py's W-quality run, publishing a base and deltas to ``directory``."""
    every = "200" if sizes is FULL else "20"
    args = ["--train", "--eval", "--epochs", "1", "--seq_len", "1", *sizes]
    args += ["--publish_every", every, "--publish_dir", str(directory)]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "example.py", *args], cwd=ROOT, capture_output=True, text=True,
        env=env,
    )  # fmt: skip
    if done.returncode:
        raise RuntimeError(f"example.py failed:\n{done.stderr[-3000:]}")


def served_auc(directory: Path, fmt: str, work: Path) -> float:
    """examples/serve.py --weights_dtype fmt: the exported program's held-out AUC."""
    scores = work / f"scores-{fmt}.pt"
    argv = ["--publish_dir", str(directory), "--weights_dtype", fmt]
    argv += ["--program", str(work / f"served-{fmt}.pt2"), "--scores_out", str(scores)]
    if serve.main(argv) != 0:
        raise RuntimeError(f"serve.py --weights_dtype {fmt} failed")
    return float(torch.load(scores, weights_only=False)["auc"])


def served_models(directory: Path) -> tuple[dict, list]:
    """The eager served model of each format (loaded at the latest version) and the
    held-out batches' pooled inputs (keys, offsets)."""
    trained = argparse.Namespace(**read_config(directory))
    data = make_dataset(trained)
    version = latest_version(directory)
    models = {}
    for fmt in FORMATS:
        model = serve.ServingDLRM(
            trained, data.num_dense, torch.device("cpu"), serve.WEIGHTS_DTYPES[fmt]
        ).eval()
        model.load(directory, version)
        models[fmt] = model
    views = id_views(trained)
    batches = data.batches(
        "eval", batch_size=trained.batch_size, rank=0, world_size=1, id_view=views
    )
    inputs = [models["float32"].inputs(b)[1:3] for b in batches]
    return models, inputs


def bytes_per_key(model) -> float:
    modules = (model.pooled, model.sequence)
    total = sum(b.numel() * b.element_size() for m in modules for b in m.buffers())
    return total / sum(sum(m.sizes) for m in modules)


def lookup_rates(models: dict, inputs: list, repeats: int) -> dict[str, list[float]]:
    """Keys per second of each format's pooled module over the held-out batches, one
    pass of each format in turn per repeat (a busy neighbour slows all alike)."""
    keys = sum(k.numel() for k, _ in inputs)
    rates = {fmt: [] for fmt in models}
    with torch.no_grad():
        for m in models.values():  # warm-up pass
            m.pooled(*inputs[0])
        for _ in range(repeats):
            for fmt, model in models.items():
                start = time.perf_counter()
                for k, o in inputs:
                    model.pooled(k, o)
                rates[fmt].append(keys / (time.perf_counter() - start))
    return rates


def pool_rates(models: dict, inputs: list, repeats: int) -> dict[str, list[float]]:
    """Keys per second of the pooling op alone over table 0 of each format's pooled
    module (its feature's keys of every held-out batch, slots found beforehand)."""
    calls = {}
    code = _ops.POOLING_CODES["SUM"]
    for fmt, model in models.items():
        module = model.pooled
        o, buffers = module.table_options[0], module.tables[0]
        tensors = buffers.tensors()
        features = len(module.feature_table_map)
        calls[fmt] = []
        for keys, offsets in inputs:
            bags = (offsets.numel() - 1) // features
            k, off = keys[: int(offsets[bags])], offsets[: bags + 1]
            s = _ops.table_find_slots(tensors, k)
            args = (s, k, off, None, code, module.missing[0], o.seed, o.dim)
            if module.row_format is None:
                calls[fmt].append(functools.partial(_ops.embedding_pool, tensors, *args))
            else:
                quantized = (tensors, buffers.rows, module.row_format)
                calls[fmt].append(
                    functools.partial(_ops.embedding_pool_quantized, *quantized, *args)
                )
    keys = sum(k.numel() for k, _ in inputs) // len(models["float32"].pooled.feature_table_map)
    rates = {fmt: [] for fmt in models}
    for fmt in models:  # warm-up
        calls[fmt][0]()
    for _ in range(repeats):
        for fmt in models:
            start = time.perf_counter()
            for call in calls[fmt]:
                call()
            rates[fmt].append(keys / (time.perf_counter() - start))
    return rates


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes (smoke run)")
    parser.add_argument("--repeats", type=int, default=5, help="lookup passes per format")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help=f"torch threads (this machine: {available_threads()})",
    )
    args = parser.parse_args(argv)
    threads = set_threads(args.threads)
    rec = Recorder(commit_hash())
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        directory = work / "published"
        train_and_publish(directory, QUICK if args.quick else FULL, threads)
        aucs = {fmt: served_auc(directory, fmt, work) for fmt in FORMATS}
        models, inputs = served_models(directory)
        sizes = {fmt: bytes_per_key(m) for fmt, m in models.items()}
        rates = lookup_rates(models, inputs, args.repeats)
        pools = pool_rates(models, inputs, args.repeats)
    for fmt in FORMATS:
        impl = f"dynemb.served.{fmt}"
        peer = None if fmt == "float32" else "dynemb.served.float32"
        for metric, values in (("auc", aucs), ("bytes_per_key", sizes)):
            rec.add(
                WORKLOAD, impl, metric, values[fmt], threads=threads, peer=peer,
                peer_value=values["float32"] if peer else None,
            )  # fmt: skip
        for metric, runs in (("lookup_keys_per_s", rates), ("pool_keys_per_s", pools)):
            rec.add(
                WORKLOAD, impl, metric, statistics.median(runs[fmt]), threads=threads,
                peer=peer, peer_value=statistics.median(runs["float32"]) if peer else None,
                runs=runs[fmt], peer_runs=runs["float32"] if peer else None,
            )  # fmt: skip
            if peer:
                ratios = [a / b for a, b in zip(runs[fmt], runs["float32"], strict=True)]
                name = metric.split("_")[0] + "_ratio"
                rec.add(WORKLOAD, impl, name, statistics.median(ratios), threads=threads)
    print(file=sys.stderr)
    rec.print_table()


if __name__ == "__main__":
    main()
