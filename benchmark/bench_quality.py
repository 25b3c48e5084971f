"""Held-out AUC of dynamic vs TorchRec tables: workload W-quality.

Usage::

    python benchmark/bench_quality.py [--quick] [--optimizer NAME] [--only torchrec|dynemb]
                                      [--threads N] [--score_strategy TIMESTAMP|STEP|LFU]
                                      [--capacity_ratio R] [--admission_probability P]

The data is ``dynemb.datasets.SyntheticClicks`` at its defaults (8 one-hot features
with Zipf(1.05) ids over 1M ids each, a hidden vector per id, 1M training rows, 100k
held-out rows, seed 0). The model and the training code are ``example.py``'s (its builders,
``dynemb._example``, imported so that the benchmark measures exactly what the example
runs): ``SequenceDLRM`` with 7
pooled tables and 1 sequence table of dim 16, trained for one epoch, batch 1024, with
the embedding optimizer fused into backward (default EXACT_ROWWISE_ADAGRAD, LR 0.05)
and Adam (LR 1e-3) on the dense part, world size 1 through
``DistributedModelParallel`` (a gloo group on a free localhost port).

- Peer (``example.py --static``): every table a TorchRec table (TABLE_WISE, FUSED
  kernel, fbgemm's CPU TBE), ids given as rows in ``[0, 1M)``.
- dynemb (``example.py``'s default): 7 dynamic tables fed the raw ids spread over 63
  bits (capacity 2^19 rows each, > 2x the distinct ids of the epoch: no eviction), and
  example.py's one ordinary TorchRec table (feature f6, identical in both runs).
- Evicting (``--capacity_ratio 0.25 --score_strategy LFU``, say): each dynamic table
  holds R times the distinct ids of a feature in the epoch, and evicts by the strategy.
- Admission (``--admission_probability 0.1``): each dynamic table admits a new id with
  that probability per occurrence (``ProbabilisticAdmissionStrategy``); an id not
  admitted reads the table's initializer row and gets no update.

Both runs see the same rows in the same order and start from the same torch seed;
initial rows are uniform in the same bounds but not the same values (a dynamic row is
a function of its key), so the AUCs differ by training noise (seeds 0-2: within
0.0005 of each other). The figure: ``auc`` of each, the dynemb one beside the peer's
(ratio ~1: no quality lost), and the Bayes AUC of the held-out rows (the AUC of the
true click probabilities, the ceiling). Beside them, each side's final training loss
and its training samples/s (a hint only: quality is the figure here). With ADAM,
fbgemm's CPU TBE has none: no peer, and f6 is dynamic too. One thread by default:
with two, a neighbour holding a core can stall every parallel region (see
bench_train.py). ``--quick`` shrinks everything (CI smoke run, ~5 s).

Output: JSON lines on stdout (``common.Recorder``), a table on stderr.
"""

import argparse
import sys
import time

import numpy as np
import torch
from common import Recorder, available_threads, commit_hash, set_threads
from dmp_setup import single_process_group

from dynemb._example import arguments as example_arguments
from dynemb._example import data as example_data
from dynemb._example import loops as example_loops
from dynemb._example import model as example_model

WORKLOAD = "W-quality"
PEER_IMPL = "torchrec.static"
DYNEMB_IMPL = "dynemb.dynamic"
OPTIMIZERS = ("EXACT_ROWWISE_ADAGRAD", "EXACT_SGD", "EXACT_ADAGRAD", "ADAM", "FTRL")
# --variants: dynemb's tables under each (optimizer, row dtype, stochastic rounding), the
# first the baseline, all on the same rows in one run (no TorchRec peer); the baseline
# runs again last, so that its two throughputs show what the order costs (the first
# run of a process pays its warm-up).
VARIANTS = (
    ("EXACT_ROWWISE_ADAGRAD", "float32", False),
    ("FTRL", "float32", False),
    ("EXACT_ROWWISE_ADAGRAD", "bfloat16", False),
    ("EXACT_ROWWISE_ADAGRAD", "bfloat16", True),
    ("EXACT_ROWWISE_ADAGRAD", "float32", False),
)
PEER_OPTIMIZERS = OPTIMIZERS[:3]  # fbgemm's CPU TBE has no Adam

# example.py flags of W-quality's sizes (one-hot sequence feature), then of --quick.
FULL = [
    "--num_train",
    "1000000",
    "--num_eval",
    "100000",
    "--seq_len",
    "1",
    "--capacity",
    str(1 << 19),
]
QUICK = [
    "--num_train",
    "20000",
    "--num_eval",
    "5000",
    "--seq_len",
    "1",
    "--vocab_size",
    "10000",
    "--capacity",
    "8192",
    "--batch_size",
    "256",
]


def example_args(sizes: list[str], optimizer: str, static: bool) -> argparse.Namespace:
    flags = ["--train", "--eval", "--epochs", "1", "--optimizer", optimizer, *sizes]
    return example_arguments.parse_args(flags + (["--static"] if static else []))


def train_and_evaluate(args: argparse.Namespace, data, label: str) -> dict:
    """One epoch of example.py's training on ``data``; returns loss, AUC and throughput."""
    torch.manual_seed(args.seed)
    device = torch.device("cpu")
    model = example_model.build_model(args, data.num_dense, torch.distributed.group.WORLD, device)
    optimizer = example_model.dense_optimizer(model, args)
    batches = dict(batch_size=args.batch_size, id_view=example_data.id_views(args))
    start = time.perf_counter()
    loss = example_loops.train_epoch(
        model, optimizer, data.batches("train", **batches), device, f"{label} train", True
    )
    seconds = time.perf_counter() - start
    auc = example_loops.evaluate(
        model, data.batches("eval", **batches), device, f"{label} eval", True
    )
    return {"auc": auc, "train_loss": loss, "samples_per_s": data.num_rows["train"] / seconds}


def capacity_of(data, ratio: float) -> int:
    """``ratio`` times the mean number of distinct ids of a feature in the training rows."""
    rows = data.rows("train")
    distinct = [np.unique(ids).size for ids in rows.ids]
    return max(1, int(ratio * sum(distinct) / len(distinct)))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes (CI smoke run)")
    parser.add_argument("--optimizer", choices=OPTIMIZERS, default="EXACT_ROWWISE_ADAGRAD")
    parser.add_argument("--only", choices=("torchrec", "dynemb"), help="run one side only")
    parser.add_argument(
        "--variants",
        action="store_true",
        help="dynemb only: row-wise Adagrad float32, FTRL float32, row-wise Adagrad "
        "bfloat16 with and without stochastic rounding, on the same rows",
    )
    parser.add_argument(
        "--score_strategy",
        choices=example_arguments.SCORE_STRATEGIES,
        default="TIMESTAMP",
        help="the dynamic tables' eviction strategy",
    )
    parser.add_argument(
        "--capacity_ratio",
        type=float,
        help="each dynamic table's capacity as a fraction of the mean distinct ids of a "
        "feature in the training rows (default: a fixed capacity above them, no eviction)",
    )
    parser.add_argument(
        "--admission_probability",
        type=float,
        help="dynamic tables admit a new key with this probability per occurrence "
        "(ProbabilisticAdmissionStrategy; default: no admission)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help=f"torch threads (this machine: {available_threads()}); one is far less slowed "
        "down by a busy neighbour (see bench_train.py)",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    threads = set_threads(args.threads)
    sizes = QUICK if args.quick else FULL
    peer_args = example_args(sizes, args.optimizer, static=True)
    dyn_args = example_args(sizes, args.optimizer, static=False)
    data = example_data.make_dataset(peer_args)  # the same rows for both; views differ
    rec = Recorder(commit_hash())
    if args.variants:
        return run_variants(args, sizes, data, rec, threads)
    if args.capacity_ratio is not None:
        dyn_args.capacity = capacity_of(data, args.capacity_ratio)
        rec.add(WORKLOAD, DYNEMB_IMPL, "capacity_rows", dyn_args.capacity, threads=threads)
    dyn_args.score_strategy = args.score_strategy
    dyn_args.admission_probability = args.admission_probability
    if args.admission_probability is not None:
        rec.add(WORKLOAD, DYNEMB_IMPL, "admission_probability", args.admission_probability,
                threads=threads)  # fmt: skip
    rec.add(WORKLOAD, "SyntheticClicks.bayes", "auc", data.bayes_auc("eval"), threads=threads)
    peer = None
    with single_process_group():
        if args.only != "dynemb" and args.optimizer in PEER_OPTIMIZERS:
            peer = train_and_evaluate(peer_args, data, PEER_IMPL)
            for metric in ("auc", "train_loss", "samples_per_s"):
                rec.add(WORKLOAD, PEER_IMPL, metric, peer[metric], threads=threads)
        if args.only != "torchrec":
            dyn = train_and_evaluate(dyn_args, data, DYNEMB_IMPL)
            for metric in ("auc", "train_loss", "samples_per_s"):
                rec.add(
                    WORKLOAD,
                    DYNEMB_IMPL,
                    metric,
                    dyn[metric],
                    threads=threads,
                    peer=PEER_IMPL if peer else None,
                    peer_value=peer[metric] if peer else None,
                )
    print(file=sys.stderr)
    rec.print_table()
    if args.optimizer not in PEER_OPTIMIZERS:
        print(
            f"{args.optimizer}: no CPU peer (fbgemm's CPU TBE has no Adam); dynemb alone.",
            file=sys.stderr,
        )


def run_variants(args, sizes, data, rec, threads) -> None:
    """``--variants``: each of VARIANTS trained and evaluated on ``data``, beside the first."""
    base = None
    with single_process_group():
        for optimizer, dtype, rounding in VARIANTS:
            dyn_args = example_args(sizes, optimizer, static=False)
            dyn_args.score_strategy = args.score_strategy
            dyn_args.embedding_dtype, dyn_args.stochastic_rounding = dtype, rounding
            label = f"{DYNEMB_IMPL}[{optimizer} {dtype}{' sr' if rounding else ''}]"
            label += " again" if base and label == base[0] else ""
            result = train_and_evaluate(dyn_args, data, label)
            for metric in ("auc", "train_loss", "samples_per_s"):
                rec.add(
                    WORKLOAD, label, metric, result[metric], threads=threads,
                    peer=base[0] if base else None,
                    peer_value=base[1][metric] if base else None,
                )  # fmt: skip
            base = base or (label, result)
    print(file=sys.stderr)
    rec.print_table()


if __name__ == "__main__":
    main()
