"""The example's data: ``dynemb.datasets.SyntheticClicks`` (W-quality's generator), and
which features are dynamic (looked up by raw ids) or ordinary (ids are rows)."""

import argparse

import torch

from dynemb._example.arguments import NUM_FEATURES, ORDINARY_FEATURE, SEQUENCE_FEATURE
from dynemb.datasets import SyntheticClicks


def make_dataset(args: argparse.Namespace) -> SyntheticClicks:
    """The synthetic clicks; every rank generates the same rows (deterministic)."""
    max_ids = [1] * NUM_FEATURES
    max_ids[int(SEQUENCE_FEATURE[1:])] = args.seq_len
    return SyntheticClicks(
        num_train=args.num_train,
        num_eval=args.num_eval,
        num_features=NUM_FEATURES,
        vocab_size=args.vocab_size,
        max_ids_per_feature=max_ids,
    )


def no_cpu_adam(args: argparse.Namespace) -> bool:
    """ADAM on CPU, which fbgemm's CPU TBE (TorchRec's FUSED kernel) does not have, or
    FTRL, which fbgemm has on no device: every table is then dynamic."""
    return args.optimizer == "FTRL" or (args.optimizer == "ADAM" and not torch.cuda.is_available())


def dynamic_features(args: argparse.Namespace) -> set[str]:
    """Features looked up in dynamic tables (their ids are given raw, spread over 63 bits)."""
    if args.static:
        return set()
    everything = {f"f{i}" for i in range(NUM_FEATURES)}
    return everything if no_cpu_adam(args) else everything - {ORDINARY_FEATURE}


def id_views(args: argparse.Namespace) -> dict[str, str]:
    dynamic = dynamic_features(args)
    return {f"f{i}": "raw" if f"f{i}" in dynamic else "row" for i in range(NUM_FEATURES)}
