"""The training workloads of benchmark/README.md: their sizes, ids and step timing.

W-train (8 tables, dim 64, pooling factor 16, 1,000,000 ids per table) and W-train-wide
(64 tables, dim 16, pooling factor 4, 100,000 ids per table) share everything else:
batch 4096, Zipf(s=1.05) ids drawn by inverse-CDF sampling from one generator, keys
spread over 63 bits for dynemb, SUM pooling, ``loss = sum of the pooled outputs``.
A ``Config`` holds one configuration; ``workload_config`` builds it from the command
line (``--workload``, ``--tables``, ``--quick``, ``--steps``).

Example::

    >>> config = Config(**workload_sizes("wide"))
    >>> config.workload, config.num_tables, config.dim, config.ids_per_batch
    ('W-train-wide', 64, 16, 1048576)
    >>> batches = make_batches(config)  # warmup + steps tensors of ids_per_batch int64
"""

import argparse
import dataclasses
import functools
import statistics
import time
from collections.abc import Callable

import numpy as np
import torch
from common import peak_rss_bytes, progress, synchronize

SPREAD = 0x9E3779B97F4A7C15
KEY_MASK = 0x7FFFFFFFFFFFFFFF


@dataclasses.dataclass(frozen=True)
class Config:
    """One training configuration; the defaults are benchmark/README.md's W-train sizes."""

    optimizer: str = "EXACT_ROWWISE_ADAGRAD"
    workload: str = "W-train"  # the name in benchmark/README.md and in the JSON lines
    num_tables: int = 8
    num_ids: int = 1_000_000
    dim: int = 64
    batch: int = 4096
    pooling_factor: int = 16
    zipf_s: float = 1.05
    seed: int = 0
    learning_rate: float = 0.01
    eps: float = 1e-8
    beta1: float = 0.9
    beta2: float = 0.999
    warmup: int = 5
    steps: int = 50
    capacity_ratio: float = 2.0  # dynemb only: capacity / distinct keys per table
    threads: int = 1
    device: str = "cpu"
    # Tiered tables: HBM per table = hbm_fraction x num_ids rows. torchrec: FUSED_UVM_CACHING
    # with this cache_load_factor; dynemb: hybrid, or a cache with ``caching``.
    hbm_fraction: float | None = None
    caching: bool = False  # dynemb only, with hbm_fraction
    # dynemb only: the rows' dtype (a torch dtype name) and stochastic rounding of
    # float16 / bfloat16 rows (DynamicEmbTableOptions.stochastic_rounding).
    embedding_dtype: str = "float32"
    stochastic_rounding: bool = False
    # dynemb only: every table's score_strategy (a DynamicEmbScoreStrategy name);
    # DECAYED_LFU halves an access's weight every score_half_life_steps steps.
    score_strategy: str = "TIMESTAMP"
    score_half_life_steps: int = 10
    # DMP only: every table's sharding type, for both (None: TorchRec table-wise on one
    # process, row-wise on more; dynemb row-wise; "auto": each planner picks by cost
    # among row-wise, table-wise and column-wise).
    sharding: str | None = None
    # DMP, dynemb only: DynamicEmbTableOptions.hot_replicas of every table (0: none),
    # chosen again every hot_refresh_steps steps; collection "ec": an EmbeddingCollection
    # (sequence, NONE pooling) instead of the EmbeddingBagCollection.
    hot_replicas: int = 0
    hot_refresh_steps: int = 20
    collection: str = "ebc"

    @property
    def ids_per_batch(self) -> int:
        return self.num_tables * self.batch * self.pooling_factor


# --workload: the Config fields of each workload that differ from the defaults (W-train).
WORKLOADS: dict[str, dict] = {
    "train": {"workload": "W-train"},
    # W-train's shape with skewed ids: Zipf(1.2), where a few keys take most lookups
    "train-skew": {"workload": "W-train-skew", "zipf_s": 1.2},
    "wide": {
        "workload": "W-train-wide",
        "num_tables": 64,
        "num_ids": 100_000,
        "dim": 16,
        "pooling_factor": 4,
    },
    "wide-rows": {
        "workload": "W-wide-rows",
        "num_tables": 4,
        "dim": 256,
        "pooling_factor": 8,
    },
}
# --quick, on top of either workload (CI smoke runs).
QUICK = {"num_ids": 10_000, "batch": 128, "pooling_factor": 4, "warmup": 1, "steps": 3}


def workload_sizes(
    workload: str = "train",
    quick: bool = False,
    steps: int | None = None,
    tables: int | None = None,
) -> dict:
    """The Config fields of ``workload`` (a key of WORKLOADS), shrunk by ``quick``, with
    ``steps`` timed steps and ``tables`` tables (one feature each) when given."""
    sizes = dict(WORKLOADS[workload])
    if quick:
        sizes.update(QUICK)
    if steps:
        sizes["steps"] = steps
    if tables:
        sizes["num_tables"] = tables
    return sizes


def add_workload_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds ``--workload train|wide`` and ``--tables N``; read them with ``workload_config``."""
    parser.add_argument(
        "--workload", choices=sorted(WORKLOADS), default="train",
        help="W-train (8 tables, dim 64) or W-train-wide (64 tables, dim 16)",
    )  # fmt: skip
    parser.add_argument("--tables", type=int, help="number of tables (default: the workload's)")


def workload_config(args: argparse.Namespace, **fields) -> Config:
    """The Config of ``args.workload`` / ``--tables`` / ``--quick`` / ``--steps``, with
    ``fields`` set over them."""
    sizes = workload_sizes(args.workload, args.quick, args.steps, args.tables)
    return Config(**{**sizes, **fields})


def variant_tag(config: Config) -> str:
    """``",tables=N"`` when ``config`` has another table count than its workload, and
    ``",sharding=TYPE"`` with a sharding type; else ''."""
    preset = next(w for w in WORKLOADS.values() if w["workload"] == config.workload)
    default = preset.get("num_tables", Config.num_tables)
    tag = "" if config.num_tables == default else f",tables={config.num_tables}"
    tag += f",sharding={config.sharding}" if config.sharding else ""
    tag += f",collection={config.collection}" if config.collection != "ebc" else ""
    return tag + (f",hot_replicas={config.hot_replicas}" if config.hot_replicas else "")


def table_names(config: Config) -> list[str]:
    return [f"t{i}" for i in range(config.num_tables)]


def feature_names(config: Config) -> list[str]:
    return [f"f{i}" for i in range(config.num_tables)]


# --- ids ---------------------------------------------------------------------------------


@functools.lru_cache(maxsize=4)
def zipf_cdf(num_ids: int, s: float) -> torch.Tensor:
    """CDF (float64) of Zipf(s) over ranks 1..num_ids; entry k is P(id <= k)."""
    weights = torch.arange(1, num_ids + 1, dtype=torch.float64).pow(-s)
    cdf = weights.cumsum(0)
    return cdf / cdf[-1]


def zipf_ids(n: int, num_ids: int, s: float, generator: torch.Generator) -> torch.Tensor:
    """``n`` int64 ids in ``[0, num_ids)``, id ``k`` with probability ``∝ 1 / (k + 1)^s``.

    Inverse-CDF sampling: uniform doubles from ``generator``, then the first id whose
    CDF exceeds each (id 0 is the most frequent).
    """
    u = torch.rand(n, generator=generator, dtype=torch.float64)
    return torch.searchsorted(zipf_cdf(num_ids, s), u, right=True).clamp_(max=num_ids - 1)


def make_batches(config: Config) -> list[torch.Tensor]:
    """``warmup + steps`` batches of ids, each ``(num_tables * batch * pooling_factor,)``.

    Feature-major (fbgemm/KJT order): feature ``t``'s ``batch * pooling_factor`` ids
    are contiguous; bag ``b`` of feature ``t`` is a run of ``pooling_factor`` ids.
    """
    gen = torch.Generator().manual_seed(config.seed)
    per_feature = config.batch * config.pooling_factor
    batches = []
    for _ in progress(range(config.warmup + config.steps), "drawing Zipf ids"):
        features = [
            zipf_ids(per_feature, config.num_ids, config.zipf_s, gen)
            for _ in range(config.num_tables)
        ]
        batches.append(torch.cat(features))
    return batches


def fixed_offsets(config: Config) -> torch.Tensor:
    """fbgemm offsets (``num_tables * batch + 1``) of bags of ``pooling_factor`` ids."""
    bags = config.num_tables * config.batch
    return torch.arange(0, bags + 1, dtype=torch.int64) * config.pooling_factor


def spread_ids(ids: torch.Tensor) -> torch.Tensor:
    """``(id * 0x9E3779B97F4A7C15) & (2^63 - 1)``, in wrapping 64-bit arithmetic."""
    keys = ids.numpy().astype(np.uint64) * np.uint64(SPREAD) & np.uint64(KEY_MASK)
    return torch.from_numpy(keys.astype(np.int64))


# --- timing ------------------------------------------------------------------------------


def time_steps(
    step: Callable[[object], None],
    inputs: list,
    warmup: int,
    desc: str,
    device: torch.device | None = None,
) -> list[float]:
    """Runs ``step(x)`` for each input; returns the wall times of those after ``warmup``.

    On cuda each step is timed between two ``torch.cuda.synchronize``.
    """
    times = []
    for i, x in enumerate(progress(inputs, desc, unit="step")):
        synchronize(device)
        start = time.perf_counter()
        step(x)
        synchronize(device)
        if i >= warmup:
            times.append(time.perf_counter() - start)
    return times


def summarize(config: Config, times: list[float], **extra) -> dict:
    """The result of one configuration: samples/s from the median step, and peak RSS."""
    return {
        "samples_per_s": config.batch / statistics.median(times),
        "samples_per_s_wall": config.batch * len(times) / sum(times),
        "peak_rss_bytes": peak_rss_bytes(),
        **extra,
    }
