"""Plots bytes sent per step and samples/s against ``hot_replicas`` (K) from the JSON
lines of ``bench_train_dmp.py --hot-replicas 0,K1,K2,...``.

Usage::

    python benchmark/bench_train_dmp.py --workload train-skew --world-sizes 2 \\
        --hot-replicas 0,256,1024,4096 > sweep.json
    python benchmark/plot_hot_keys.py sweep.json --out hot_keys.png
"""

import argparse
import collections
import json


def read_sweep(path: str) -> dict[str, dict[int, float]]:
    """metric -> K -> value, of dynemb's lines (K = 0: no hot replicas)."""
    found: dict[str, dict[int, float]] = collections.defaultdict(dict)
    with open(path) as f:
        for line in f:
            if not line.startswith("{"):
                continue
            row = json.loads(line)
            if not row["impl"].startswith("dynemb"):
                continue
            metric, _, tags = row["metric"].partition("@")
            k = 0
            for tag in tags.split(","):
                if tag.startswith("hot_replicas="):
                    k = int(tag.split("=")[1])
            found[metric][k] = row["value"]
    return found


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("sweep", help="bench_train_dmp.py's JSON lines")
    parser.add_argument("--out", default="hot_keys.png")
    parser.add_argument("--title", default="")
    args = parser.parse_args(argv)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sweep = read_sweep(args.sweep)
    ks = sorted(sweep["samples_per_s"])
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for metric, label in (
        ("input_bytes_per_step", "input all-to-all"),
        ("a2a_bytes_per_step", "every all-to-all"),
        ("allreduce_bytes_per_step", "hot-key all-reduce"),
    ):
        values = sweep.get(metric, {})
        left.plot(ks, [values.get(k, 0) / 2**20 for k in ks], marker="o", label=label)
    left.set_xlabel("hot_replicas (K per table)")
    left.set_ylabel("MiB sent per step and rank")
    left.legend()
    right.plot(ks, [sweep["samples_per_s"][k] for k in ks], marker="o")
    right.set_xlabel("hot_replicas (K per table)")
    right.set_ylabel("samples/s per process (one host's loopback)")
    for axis in (left, right):
        axis.set_xscale("symlog", linthresh=128)
    fig.suptitle(args.title)
    fig.tight_layout()
    fig.savefig(args.out, dpi=100)
    print(args.out)


if __name__ == "__main__":
    main()
