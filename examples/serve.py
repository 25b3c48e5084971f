"""Serves a version that ``example.py --publish_every K`` published: scores the held-out set.

Usage::

    python example.py --train --eval --publish_every 100   # publishes to dynemb_example_deltas
    python examples/serve.py                               # the latest version: the same AUC
    python examples/serve.py --version 2                   # base + deltas 1..2
    python examples/serve.py --weights_dtype int8          # 8-bit rows (or e4m3)

Serves exactly the version asked for (the latest: the highest committed delta) or
refuses, naming every missing file (``base/``, ``delta-<N>/``, ``dense-<N>.pt``) or the
damaged one: never an older version in its place.

What it does: rebuilds example.py's DLRM from the arguments the example saved
(``example.json``) with its dynamic tables replaced by dynemb's inference modules
(``InferenceEmbeddingBagCollection`` for the pooled features,
``InferenceEmbeddingCollection`` for the sequence feature), loads the base checkpoint
and replays the deltas in version order (``apply_delta``), loads the dense layers and
ordinary tables of that version, exports the whole model with ``torch.export.export``,
saves and reloads the program (``torch.export.save`` / ``load``), scores the held-out
rows with the loaded program and prints their AUC. The logits equal the ones the
training model gave at that version in eval mode bit for bit, so the AUC is the one
``example.py --eval`` printed after training (tests/example/test_example_serve.py checks both).
With ``--weights_dtype int8`` or ``e4m3`` the dynamic tables hold 8-bit rows
(DynamicEmb_APIs.md, "8-bit rows"): the logits then differ from the trained model's
within the quantization's bound, and so may the AUC.
"""

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.export import Dim
from torchrec.datasets.utils import Batch

from dynemb._example import silence_known_notices
from dynemb._example.data import dynamic_features, id_views, make_dataset
from dynemb._example.model import dynamic_table_options, table_configs, unsharded_model
from dynemb._example.publishing import (
    CONFIG,
    latest_version,
    missing_files,
    read_config,
    read_version,
)
from dynemb.datasets import roc_auc
from dynemb.deltas import delta_path
from dynemb.inference.exportable_tables import (
    InferenceEmbeddingBagCollection,
    InferenceEmbeddingCollection,
)
from dynemb.models import mean_of_rows

silence_known_notices()

MEAN = 2  # DynamicEmb's pooling code: the example's pooled tables average their rows
# --weights_dtype: how the dynamic tables store their rows (None: as trained)
WEIGHTS_DTYPES = {"float32": None, "int8": torch.int8, "e4m3": torch.float8_e4m3fn}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--publish_dir",
        "--publish-dir",
        default="dynemb_example_deltas",
        help="what example.py --publish_every wrote",
    )
    parser.add_argument(
        "--version", type=int, default=None, help="the version to serve; None: the latest"
    )
    parser.add_argument(
        "--program",
        default="dynemb_example_served.pt2",
        help="where the exported program is saved (torch.export.save), then loaded from",
    )
    parser.add_argument(
        "--weights_dtype",
        choices=list(WEIGHTS_DTYPES),
        default="float32",
        help="the dynamic tables' rows: float32 as trained, or 8-bit (int8 or e4m3)",
    )
    parser.add_argument(
        "--scores_out",
        default=None,
        help="torch.save {version, auc, logits} to this file (logits in the example's order)",
    )
    return parser.parse_args(argv)


class ServingDLRM(nn.Module):
    """example.py's SequenceDLRM for serving: the same dense, interaction and over layers;
    inference modules in place of the dynamic tables; the ordinary tables as weights.

    Inputs are tensors, prepared from a batch by ``inputs``: the dense features, the
    dynamic pooled features' keys and offsets (feature-major, fbgemm's TBE layout), one
    (ids, offsets) pair per ordinary table, and the sequence feature's keys and offsets.
    """

    def __init__(
        self,
        args: argparse.Namespace,
        num_dense: int,
        device: torch.device,
        weights_dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        pooled, sequence = table_configs(args)
        dynamic = dynamic_features(args)
        dlrm = unsharded_model(args, num_dense)  # the layers, and their order
        self.dim = args.embedding_dim
        self.pooled_features = list(dlrm.pooled_features)
        self.sequence_features = list(dlrm.sequence_features)
        self.dynamic_pooled = [t for t in pooled if t.feature_names[0] in dynamic]
        self.ordinary_pooled = [t for t in pooled if t.feature_names[0] not in dynamic]
        if [t.feature_names[0] for t in sequence] != self.sequence_features or not all(
            f in dynamic for f in self.sequence_features
        ):
            raise ValueError(f"serve.py serves dynamic sequence tables; got {sequence}")
        self.pooled = InferenceEmbeddingBagCollection(
            [_options(args) for _ in self.dynamic_pooled],
            pooling_mode=MEAN,
            table_names=[t.name for t in self.dynamic_pooled],
            feature_names=[t.feature_names[0] for t in self.dynamic_pooled],
            device=device,
            weights_dtype=weights_dtype,
        )
        self.sequence = InferenceEmbeddingCollection(
            [_options(args) for _ in sequence],
            table_names=[t.name for t in sequence],
            feature_names=self.sequence_features,
            device=device,
            weights_dtype=weights_dtype,
        )
        # Ordinary tables (f6's, unless every table is dynamic), filled by load.
        self.ordinary = nn.ParameterDict(
            {
                t.name: nn.Parameter(torch.empty(t.num_embeddings, t.embedding_dim), False)
                for t in self.ordinary_pooled
            }
        )
        self.dense_arch = dlrm.dense_arch
        self.inter_arch = dlrm.inter_arch
        self.over_arch = dlrm.over_arch
        self.to(device)  # the dense layers and ordinary tables (the tables are there already)

    def load(self, directory: Path, version: int) -> None:
        """Version ``version`` of ``directory``: the base, deltas 1..version, dense-N."""
        for module in (self.pooled, self.sequence):
            module.load_from_dynamicemb_file(directory / "base")
            for v in range(1, version + 1):
                module.apply_delta(delta_path(directory, v))
        dense, tables = read_version(directory, version)
        prefix = "embedding_bag_collection.embedding_bags."
        if set(tables) != {f"{prefix}{t.name}.weight" for t in self.ordinary_pooled}:
            raise ValueError(f"{directory}: ordinary tables {sorted(tables)} are not the model's")
        with torch.no_grad():
            for t in self.ordinary_pooled:
                self.ordinary[t.name].copy_(tables[f"{prefix}{t.name}.weight"])
        layers = nn.ModuleDict(
            dict(dense_arch=self.dense_arch, inter_arch=self.inter_arch, over_arch=self.over_arch)
        )
        layers.load_state_dict(dense)  # strict: every dense tensor, nothing else

    def forward(
        self,
        dense: torch.Tensor,
        dynamic_keys: torch.Tensor,
        dynamic_offsets: torch.Tensor,
        ordinary: tuple[tuple[torch.Tensor, torch.Tensor], ...],
        sequence_keys: torch.Tensor,
        sequence_offsets: torch.Tensor,
    ) -> torch.Tensor:
        """``(B,)`` logits, as SequenceDLRM.forward computes them."""
        pooled = self.pooled(dynamic_keys, dynamic_offsets)  # (B, F_dynamic * D)
        columns = dict(
            zip(self.pooled.feature_names, torch.split(pooled, self.dim, dim=1), strict=True)
        )
        for t, (ids, offsets) in zip(self.ordinary_pooled, ordinary, strict=True):
            mean = F.embedding_bag(
                ids, self.ordinary[t.name], offsets, mode="mean", include_last_offset=True
            )
            # As the trained model: fbgemm's mean, divided by nothing more (dynemb's
            # sharded EBC keeps TorchRec's mean callback to the row-wise mean tables'
            # columns: dynemb/shard/mean_divisor.py).
            columns[t.feature_names[0]] = mean
        stacked = [columns[f] for f in self.pooled_features]
        rows = self.sequence(sequence_keys, sequence_offsets)  # (n, D)
        stacked.append(mean_of_rows(rows, sequence_offsets[1:] - sequence_offsets[:-1]))
        sparse = torch.stack(stacked, dim=1)  # (B, F, D)
        return self.over_arch(self.inter_arch(self.dense_arch(dense), sparse)).squeeze(-1)

    def inputs(self, batch: Batch) -> tuple:
        """The forward arguments of a batch of the example's dataset."""
        features = batch.sparse_features.to_dict()
        device = self.pooled.device

        def packed(names: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
            keys = torch.cat([features[f].values() for f in names]).long()
            lengths = torch.cat([features[f].lengths() for f in names]).long()
            offsets = torch.cat([lengths.new_zeros(1), torch.cumsum(lengths, 0)])
            return keys.to(device), offsets.to(device)

        dynamic = packed([t.feature_names[0] for t in self.dynamic_pooled])
        ordinary = tuple(packed(t.feature_names) for t in self.ordinary_pooled)
        dense = batch.dense_features.to(device)
        return (dense, *dynamic, ordinary, *packed(self.sequence_features))


def _options(args: argparse.Namespace):
    """A dynamic table's options as trained (one process: all rows, all capacity)."""
    options = dynamic_table_options(args)
    options.dim, options.max_capacity = args.embedding_dim, args.capacity
    return options


def dynamic_shapes(inputs: tuple) -> tuple:
    """Every input's first dimension (batch, keys, bags) free: one program for every batch."""
    free = {0: Dim.AUTO}
    ordinary = inputs[3]
    return (free, free, free, tuple((free, free) for _ in ordinary), free, free)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    directory = Path(args.publish_dir)
    if not (directory / CONFIG).is_file():
        print(
            f"--publish_dir {directory}: no {CONFIG}; run example.py --publish_every K first",
            file=sys.stderr,
        )
        return 2
    latest = latest_version(directory)
    if latest is None:
        print(f"--publish_dir {directory}: no complete version yet", file=sys.stderr)
        return 2
    version = latest if args.version is None else args.version
    asked = (
        f"--version {version}" if args.version is not None else f"the latest version ({version})"
    )
    if not 0 <= version <= latest:
        print(
            f"{asked}: {directory} holds no such version (the latest is {latest})", file=sys.stderr
        )
        return 2
    # Exactly the version asked for, or nothing: never an older one in its place.
    missing = missing_files(directory, version)
    if missing:
        print(
            f"{asked}: cannot serve version {version} of {directory}: {', '.join(missing)} missing",
            file=sys.stderr,
        )
        return 2
    trained = argparse.Namespace(**read_config(directory))
    data = make_dataset(trained)
    # The device example.py trains on (its logits are that device's arithmetic).
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = ServingDLRM(trained, data.num_dense, device, WEIGHTS_DTYPES[args.weights_dtype]).eval()
    try:
        model.load(directory, version)
    except (ValueError, OSError) as e:  # a damaged file, named by the error
        print(f"{asked}: cannot serve version {version} of {directory}: {e}", file=sys.stderr)
        return 2
    views = id_views(trained)
    batches = list(
        data.batches("eval", batch_size=trained.batch_size, rank=0, world_size=1, id_view=views)
    )
    first = model.inputs(batches[0])
    program = torch.export.export(model, first, dynamic_shapes=dynamic_shapes(first))
    torch.export.save(program, args.program)
    served = torch.export.load(args.program).module()
    with torch.no_grad():
        logits = torch.cat([served(*model.inputs(b)).cpu() for b in batches])
    labels = torch.cat([b.labels for b in batches])
    auc = roc_auc(logits, labels)
    print(
        f"served version {version} of {directory} (base + {version} deltas), exported to "
        f"{args.program} ({args.weights_dtype} rows): held-out AUC {auc:.4f} over "
        f"{len(labels)} rows",
        flush=True,
    )
    if args.scores_out:
        torch.save(dict(version=version, auc=auc, logits=logits), args.scores_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
