"""Instructions and cycles of each phase of a training step, from the CPU's counters:
dynemb vs TorchRec through DMP.

Usage::

    python benchmark/count_phases.py [--quick] [--workload train|wide] [--tables N]
                                     [--optimizer NAME] [--only torchrec|dynemb]
                                     [--steps N] [--threads N]

Why: wall time on a shared 2-core virtual machine can move by 2x within an hour and
hosts of one machine kind differ several-fold (benchmark/host.py), but the
instructions a step retires do not depend on the host, and on a host with fast memory
dynemb's step is bound by them. Cycles are printed
beside them: their ratio says whether a phase waits on memory on this host.

For each (implementation, phase) a child process runs under ``perf stat`` with its
counters disabled (``--control fifo:ctl,ack -D -1``). It builds the model as
profile_train.py does (world size 1, one gloo process), runs ``warmup`` steps, then
``steps`` steps, enabling the counters only around the phase (each toggle waits for
perf's ack):

- ``step``: the whole step (input dist to backward);
- ``lookup``: ``compute`` (dynemb: dedup, probe and pooling; TorchRec: its forward op);
- ``backward``: ``loss.backward()`` (gradient reduction and the fused optimizer);
- ``dedup``, ``probe``, ``pooling``, ``update`` (dynemb only): the calls of
  ``dynemb._ops.unique_keys_grouped``, ``table_find_or_insert_slots_grouped``,
  ``embedding_pool_into_grouped`` and ``embedding_backward_grouped`` (the gradient
  sums and the fused optimizer; ``backward`` less ``update`` is autograd and Python).

Output: a JSON line per (implementation, phase, counter), per step, dynemb's beside
TorchRec's where both have the phase; a table on stderr. Needs ``perf`` and hardware
counters (Linux ``perf_event_paranoid`` <= 2 for one's own processes); it says which is
missing otherwise. ``--quick`` proves the script runs (tiny sizes).
"""

import argparse
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from bench_train import OPTIMIZERS, has_peer
from common import Recorder, commit_hash, print_rows, set_threads
from train_workloads import Config, add_workload_arguments, workload_config

COUNTERS = ("instructions", "cycles")
BOTH = ("step", "lookup", "backward")  # phases of either implementation
OPS = {  # dynemb-only phases: the dynemb._ops function each one counts
    "dedup": "unique_keys_grouped",
    "probe": "table_find_or_insert_slots_grouped",
    "pooling": "embedding_pool_into_grouped",
    "update": "embedding_backward_grouped",
}
IMPL_NAMES = {"torchrec": "torchrec.EBC.FUSED", "dynemb": "dynemb.EBC.DMP"}


class Counters:
    """perf's control and ack fifos: ``on()`` / ``off()`` return once perf acted."""

    def __init__(self, control: str, ack: str) -> None:
        self._control = os.open(control, os.O_WRONLY)
        self._ack = os.open(ack, os.O_RDONLY)

    def _send(self, command: bytes) -> None:
        os.write(self._control, command)
        os.read(self._ack, 5)  # "ack\n\0"

    def on(self) -> None:
        self._send(b"enable\n")

    def off(self) -> None:
        self._send(b"disable\n")


def counted(counters: Counters, fn):
    """fn, with the counters on around each call while ``counted.active``."""

    def wrapper(*args, **kwargs):
        if not counted.active:
            return fn(*args, **kwargs)
        counters.on()
        try:
            return fn(*args, **kwargs)
        finally:
            counters.off()

    return wrapper


counted.active = False


def child(impl: str, phase: str, config: Config, control: str, ack: str) -> None:
    """Runs under perf: warm-up steps, then ``config.steps`` counted ones."""
    from bench_train_dmp import build_model, rank_inputs
    from dmp_setup import single_process_group

    from dynemb import _ops

    counters = Counters(control, ack)
    if phase in OPS:
        name = OPS[phase]
        setattr(_ops, name, counted(counters, getattr(_ops, name)))
    device = torch.device("cpu")
    inputs = rank_inputs(impl, config, 0, device)

    def step(sharded, kjt, count: bool) -> None:
        def around(name: str):
            return counters if count and phase == name else None

        ctx = sharded.create_context()
        if c := around("step"):
            c.on()
        features = sharded.input_dist(ctx, kjt).wait().wait()
        if c := around("lookup"):
            c.on()
        embeddings = sharded.compute(ctx, features)
        if c := around("lookup"):
            c.off()
        loss = sharded.output_dist(ctx, embeddings).wait().values().sum()
        if c := around("backward"):
            c.on()
        loss.backward()
        if c := around("backward") or around("step"):
            c.off()

    with single_process_group():
        sharded = build_model(impl, config, 1, device).module
        for kjt in inputs[: config.warmup]:
            step(sharded, kjt, False)
        counted.active = True
        for kjt in inputs[config.warmup :]:
            step(sharded, kjt, True)


def count(impl: str, phase: str, config: Config) -> dict[str, float]:
    """Counters per step of ``phase`` of ``impl``, from a child under perf stat."""
    with tempfile.TemporaryDirectory() as tmp:
        control, ack, out = (str(Path(tmp) / n) for n in ("control", "ack", "perf.csv"))
        os.mkfifo(control)
        os.mkfifo(ack)
        command = [
            "perf", "stat", "-x", ",", "-o", out, "-e", ",".join(COUNTERS), "-D", "-1",
            f"--control=fifo:{control},{ack}", "--", sys.executable, __file__, "--child", impl,
            phase, json.dumps(dataclasses.asdict(config)), control, ack,
        ]  # fmt: skip
        child_run = subprocess.run(command, stderr=subprocess.PIPE, text=True)
        noise = ("Events enabled", "Events disabled")  # perf's line per toggle
        sys.stderr.write("".join(
            line for line in child_run.stderr.splitlines(keepends=True)
            if line.strip() not in noise
        ))  # fmt: skip
        if child_run.returncode != 0:
            raise SystemExit(f"count_phases.py: {impl} {phase} failed ({child_run.returncode})")
        values = {}
        for line in Path(out).read_text().splitlines():
            fields = line.split(",")
            if len(fields) > 2 and fields[2].split(":")[0] in COUNTERS:
                if not fields[0].replace(".", "").isdigit():
                    raise SystemExit(f"count_phases.py: perf counted no {fields[2]} ({fields[0]})")
                values[fields[2].split(":")[0]] = float(fields[0]) / config.steps
    return values


def main(argv: list[str] | None = None) -> None:
    if argv is None and len(sys.argv) > 1 and sys.argv[1] == "--child":
        impl, phase, config, control, ack = sys.argv[2:7]
        set_threads(json.loads(config)["threads"])
        return child(impl, phase, Config(**json.loads(config)), control, ack)
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes (CI smoke run)")
    parser.add_argument("--optimizer", choices=OPTIMIZERS, default="EXACT_ROWWISE_ADAGRAD")
    parser.add_argument("--only", choices=sorted(IMPL_NAMES), help="this implementation only")
    parser.add_argument("--steps", type=int, help="counted steps (default 8, quick 2)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    add_workload_arguments(parser)
    args = parser.parse_args(argv)
    if shutil.which("perf") is None:
        raise SystemExit("count_phases.py: needs `perf` (Debian: linux-perf), found none")
    config = workload_config(
        args, optimizer=args.optimizer, threads=set_threads(args.threads),
        steps=args.steps or (2 if args.quick else 8), warmup=1 if args.quick else 5,
    )  # fmt: skip
    impls = [args.only] if args.only else list(IMPL_NAMES)
    if not has_peer(config) and "torchrec" in impls:
        impls.remove("torchrec")
    results: dict[tuple[str, str], dict[str, float]] = {}
    for impl in impls:
        for phase in BOTH + (tuple(OPS) if impl == "dynemb" else ()):
            started = time.perf_counter()
            results[impl, phase] = count(impl, phase, config)
            print(f"{impl} {phase}: {time.perf_counter() - started:.0f} s", file=sys.stderr)
    rec = Recorder(commit_hash())
    rows = []
    for (impl, phase), values in results.items():
        peer = results.get(("torchrec", phase)) if impl == "dynemb" else None
        for counter, value in values.items():
            rec.add(
                config.workload, IMPL_NAMES[impl], f"{counter}_per_step[{phase}]@{config.optimizer}",
                value, threads=config.threads, peer=IMPL_NAMES["torchrec"] if peer else None,
                peer_value=peer[counter] if peer else None,
            )  # fmt: skip
        rows.append((impl, phase, *(f"{values[c] / 1e6:.1f}" for c in COUNTERS)))
    print_rows(("impl", "phase", "M instructions", "M cycles"), rows)


if __name__ == "__main__":
    main()
