"""example.py's command line: its flags, the example's fixed shape (8 features, which
are dynamic) and the checks of flags that cannot run together."""

import argparse
from pathlib import Path

OPTIMIZERS = ("EXACT_SGD", "EXACT_ADAGRAD", "EXACT_ROWWISE_ADAGRAD", "ADAM", "FTRL")
EMBEDDING_DTYPES = ("float32", "bfloat16", "float16")
DIST_TYPES = ("continuous", "roundrobin", "hash_roundrobin")
# CUSTOMIZED needs scores from the caller; NO_EVICTION grows instead of evicting.
SCORE_STRATEGIES = ("TIMESTAMP", "STEP", "LFU")
NUM_FEATURES = 8
SEQUENCE_FEATURE = "f7"  # the EmbeddingCollection's feature
ORDINARY_FEATURE = "f6"  # a TorchRec table even without --static
DESCRIPTION = "dynemb example: a DLRM with dynamic embedding tables, trained on synthetic clicks."


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=DESCRIPTION,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        epilog="The default sizes (500k of W-quality's 1M training rows) finish in under a "
        "minute with torchrun --nproc_per_node=2 on 2 CPU cores (under 3 minutes on a busy "
        "machine). W-quality's sizes: --num_train 1000000 --seq_len 1 "
        "(benchmark/bench_quality.py).",
    )
    run = parser.add_argument_group("what to run")
    run.add_argument("--train", action="store_true", help="train for --epochs epochs")
    run.add_argument("--eval", action="store_true", help="held-out AUC after each epoch")
    run.add_argument("--dump", action="store_true", help="save a checkpoint to --checkpoint_dir")
    run.add_argument("--load", action="store_true", help="load --checkpoint_dir first")
    run.add_argument("--checkpoint_dir", default="dynemb_example_ckpt", help="for --dump/--load")
    run.add_argument(
        "--publish_every",
        "--publish-every",
        type=int,
        default=0,
        metavar="K",
        help="with --train: publish the model to --publish_dir before training "
        "(version 0), every K steps and after each epoch (1, 2, ...): the dynamic tables as "
        "a base checkpoint and deltas (dynemb.deltas), the dense layers and the ordinary "
        "table's changed rows beside them; examples/serve.py serves any version. 0: off",
    )
    run.add_argument(
        "--publish_dir",
        "--publish-dir",
        default="dynemb_example_deltas",
        help="for --publish_every: a new or empty directory",
    )
    run.add_argument(
        "--scores_out",
        default=None,
        help="with --eval: torch.save the held-out logits of each evaluation to this file "
        "(a list of {epoch, version, auc, logits}; logits in batch order, ranks after each other)",
    )
    run.add_argument(
        "--stats",
        action="store_true",
        help="after each epoch, print every rank's dynamic tables' telemetry (dynemb.telemetry: "
        "hits, inserts, evictions, failures, load factor, bucket fill, and the ages and ranks "
        "of the keys evicted, sampled at every step)",
    )
    model = parser.add_argument_group("tables and training")
    model.add_argument("--static", action="store_true", help="all tables ordinary TorchRec")
    model.add_argument(
        "--dist_type",
        choices=DIST_TYPES,
        default="roundrobin",
        help="how dynamic tables route raw ids to ranks",
    )
    model.add_argument(
        "--optimizer",
        choices=OPTIMIZERS,
        default="EXACT_ROWWISE_ADAGRAD",
        help="embedding optimizer (fused into the backward)",
    )
    model.add_argument("--learning_rate", type=float, default=0.05, help="embedding LR")
    model.add_argument(
        "--embedding_dtype",
        choices=EMBEDDING_DTYPES,
        default="float32",
        help="dynamic tables' row storage (with its optimizer state)",
    )
    model.add_argument(
        "--stochastic_rounding",
        action="store_true",
        help="16-bit rows round optimizer results stochastically (else to nearest)",
    )
    model.add_argument("--dense_learning_rate", type=float, default=1e-3, help="Adam LR")
    model.add_argument("--batch_size", type=int, default=1024, help="samples per rank")
    model.add_argument(
        "--epochs",
        type=int,
        default=1,
        help="passes over the training rows; more than one overfits (the rows of rare ids "
        "memorise their few labels), as usual for click models",
    )
    model.add_argument("--embedding_dim", type=int, default=16, help="width of every table")
    model.add_argument(
        "--capacity",
        type=int,
        default=1 << 18,
        help="rows of each dynamic table (all ranks together)",
    )
    model.add_argument(
        "--score_strategy",
        choices=SCORE_STRATEGIES,
        default="TIMESTAMP",
        help="what an evicting dynamic table keeps when full (DynamicEmbScoreStrategy)",
    )
    model.add_argument(
        "--init_bound", type=float, default=0.05, help="new rows are uniform in [-bound, bound]"
    )
    model.add_argument(
        "--admission_probability",
        type=float,
        default=None,
        help="dynamic tables admit a new key with this probability per occurrence "
        "(ProbabilisticAdmissionStrategy; default: every key)",
    )
    model.add_argument(
        "--caching",
        action="store_true",
        help="dynamic tables in caching mode: a cache of --cache_fraction of the rows in "
        "front of a slow table holding all of them",
    )
    model.add_argument(
        "--cache_fraction", type=float, default=0.25, help="cache rows / capacity (--caching)"
    )
    model.add_argument(
        "--prefetch",
        action="store_true",
        help="with --caching: fetch batch t+1's rows into the caches while batch t trains",
    )
    model.add_argument("--seed", type=int, default=0, help="model seed (the data's is fixed)")
    data = parser.add_argument_group("data (dynemb.datasets.SyntheticClicks)")
    data.add_argument(
        "--num_train", type=int, default=500_000, help="training rows: a prefix of W-quality's 1M"
    )
    data.add_argument("--num_eval", type=int, default=100_000, help="held-out rows")
    data.add_argument("--vocab_size", type=int, default=1_000_000, help="ids per feature")
    data.add_argument(
        "--seq_len",
        type=int,
        default=4,
        help=f"ids per sample of {SEQUENCE_FEATURE}: uniform in [1, seq_len]",
    )
    args = parser.parse_args(argv)
    if not (args.train or args.eval or args.dump or args.load):
        parser.error("nothing to do: give --train, --eval, --dump and/or --load")
    return args


def publish_refusal(args: argparse.Namespace) -> str | None:
    """Why ``--publish_every`` cannot run with these arguments, or None."""
    if args.publish_every == 0:
        return None
    flag = f"--publish_every {args.publish_every}"
    if args.publish_every < 0:
        return f"{flag}: K must be a number of steps >= 1 (0: off)"
    if not args.train:
        return f"{flag} publishes during training: give --train"
    if args.static or args.caching:
        return (
            f"{flag} publishes dynamic tables without a cache: not with "
            f"{'--static' if args.static else '--caching'}"
        )
    directory = Path(args.publish_dir)
    if directory.exists() and (not directory.is_dir() or any(directory.iterdir())):
        return f"--publish_dir {directory}: must be a new or empty directory, it holds files"
    return None
