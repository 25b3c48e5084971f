"""Where a training step's time goes: dynemb vs TorchRec through DMP, under torch.profiler.

Usage::

    python benchmark/profile_train.py [--quick] [--workload train|wide] [--tables N]
                                      [--optimizer NAME] [--only torchrec|dynemb]
                                      [--steps N] [--threads N] [--trace] [--out DIR]

Runs a few steps of W-train (or W-train-wide; train_workloads.py) for each
implementation, built by bench_train_dmp.py's ``build_model`` at world size 1 (one gloo
process in this process: the TorchRec peer FUSED and TABLE_WISE, dynemb ROW_WISE), after
``warmup`` unprofiled steps, under ``torch.profiler`` (CPU activities, no shapes). The
step is ``ShardedModule.forward``'s, stage by stage, each under a label of ours::

    input_dist(ctx, kjt).wait().wait()  -> "## input dist ##"
    compute(ctx, features)              -> "## lookup ##"   (the kernels' forward)
    output_dist(ctx, embs).wait()       -> "## output dist ##"
    .values().sum()                     -> "## loss ##"
    loss.backward()                     -> "## backward ##" (with the fused optimizer)

Breakdown: every microsecond of the main thread inside a step goes to the innermost
profiler event around it (its self time); that event's phase is the one of the first
rule (``PHASE_RULES``) matching it or an event around it, else "Python / other" (the
remainder: Python, autograd, tensor copies, the loss). The rules read the names the
ops carry (``dynemb::*`` ops of dynemb/_ops.py, fbgemm's TBE ops) and the labels above;
nothing in dynemb is instrumented. What cannot be separated so:

- backward reduction and optimizer: one fused op in both (``dynemb::embedding_backward``
  or ``_grouped``;
  fbgemm's ``split_embedding_backward_codegen_*_cpu``, which also sorts the indices):
  one combined row;
- TorchRec has no dedup and no hash probe: a static row is its id; its forward op
  gathers and pools (row "pooling");
- ``--threads 1`` by default: the figures of a shared 2-core machine are steadier so
  (ops still use their own intra-op threads inside).

Output: JSON lines of the breakdown on stdout (ms per step per phase, dynemb's beside the
peer's), the breakdown table and the main "Python / other" ops on stderr; in ``--out``
(default benchmark/out/): ``profile_<workload>_<impl>.txt``, the profiler's table (top 30
by self CPU time), the breakdown ``profile_<workload>.txt`` and, with ``--trace``, a
chrome trace ``profile_<workload>_<impl>.json`` per implementation. Timings on a shared
machine are noisy (see bench_train.py); ``--quick`` proves the script runs (seconds).
"""

import argparse
import collections
import io
import re
import sys
from pathlib import Path

import torch
from bench_train import OPTIMIZERS, has_peer
from bench_train_dmp import DYNEMB_IMPL, PEER_IMPL, build_model, rank_inputs
from common import REPO_ROOT, Recorder, commit_hash, print_rows, set_threads
from dmp_setup import single_process_group
from torch.profiler import ProfilerActivity, profile, record_function
from train_workloads import Config, add_workload_arguments, workload_config

IMPLS = {"torchrec": PEER_IMPL, "dynemb": DYNEMB_IMPL}
STEP, INPUT_DIST, LOOKUP, OUTPUT_DIST, LOSS, BACKWARD = (
    "## step ##", "## input dist ##", "## lookup ##", "## output dist ##", "## loss ##",
    "## backward ##",
)  # fmt: skip
STAGES = (STEP, INPUT_DIST, LOOKUP, OUTPUT_DIST, LOSS, BACKWARD)  # the innermost one counts
OTHER = "Python / other"
FUSED_BACKWARD = "backward reduction + optimizer"
# (phase, pattern of an event name): the innermost event matching a pattern gives its phase
# to itself and to every event inside it that matches none.
PHASE_RULES = (
    ("input distribution", re.escape(INPUT_DIST)),
    ("dedup / unique", r"dynemb::unique_keys(_grouped)?"),
    ("hash probe / lookup", r"dynemb::table_find(_or_insert)?(_slots)?(_grouped)?"),
    (
        "pooling",
        r"dynemb::embedding_(pool(_into)?(_grouped)?|gather)|fbgemm::split_embedding_codegen_forward_\w+",
    ),
    ("output distribution", re.escape(OUTPUT_DIST)),
    # the output dist's collectives, run backward (none at world size 1)
    ("output distribution", r"autograd::engine::evaluate_function: .*(All2All|AllGather|Reduce).*"),
    (
        FUSED_BACKWARD,
        r"dynemb::embedding_backward(_grouped)?|fbgemm::split_embedding_backward_codegen_\w+",
    ),
)
PHASES = tuple(dict.fromkeys([p for p, _ in PHASE_RULES] + [OTHER]))
NOT_IN_TORCHREC = ("dedup / unique", "hash probe / lookup")
_RULES = [(phase, re.compile(pattern)) for phase, pattern in PHASE_RULES]


def labelled_step(sharded: torch.nn.Module, kjt) -> None:
    """One training step of a sharded EmbeddingBagCollection, stage by stage as
    ``ShardedModule.forward`` runs them (compute, then output dist), each under its label."""
    ctx = sharded.create_context()
    with record_function(INPUT_DIST):
        features = sharded.input_dist(ctx, kjt).wait().wait()
    with record_function(LOOKUP):
        embeddings = sharded.compute(ctx, features)
    with record_function(OUTPUT_DIST):
        pooled = sharded.output_dist(ctx, embeddings).wait()
    with record_function(LOSS):
        loss = pooled.values().sum()
    with record_function(BACKWARD):
        loss.backward()


def profile_impl(impl: str, config: Config) -> profile:
    """Builds ``impl``'s model, runs ``warmup`` steps, then profiles ``steps`` steps."""
    device = torch.device("cpu")
    inputs = rank_inputs(impl, config, 0, device)
    with single_process_group():
        sharded = build_model(impl, config, 1, device).module  # DMP's forward: just this
        for kjt in inputs[: config.warmup]:
            labelled_step(sharded, kjt)
        with profile(activities=[ProfilerActivity.CPU], record_shapes=False) as prof:
            for kjt in inputs[config.warmup :]:
                with record_function(STEP):
                    labelled_step(sharded, kjt)
    return prof


def rule_phase(name: str) -> str | None:
    return next((phase for phase, pattern in _RULES if pattern.fullmatch(name)), None)


class Breakdown:
    """Main-thread time of the profiled steps per phase (ms per step), and per op of
    "Python / other".

    Args:
        prof: a finished profile whose steps ran under the ``STEP`` label.
    """

    def __init__(self, prof: profile) -> None:
        per_phase = dict.fromkeys(PHASES, 0.0)
        self.other_ops: collections.Counter = collections.Counter()  # op -> us
        self.other_stages: collections.Counter = collections.Counter()  # stage label -> us
        steps = 0
        for event in prof.events():
            steps += event.name == STEP
            phase, stage, e = None, None, event
            while e is not None:  # the innermost matching rule, and the stage around
                phase = phase or rule_phase(e.name)
                stage = stage or (e.name if e.name in STAGES else None)
                e = e.cpu_parent
            if stage is None:
                continue  # outside the profiled steps
            per_phase[phase or OTHER] += event.self_cpu_time_total
            if phase is None:
                self.other_ops[event.name] += event.self_cpu_time_total
                self.other_stages[stage] += event.self_cpu_time_total
        self.steps = max(steps, 1)
        self.ms = {phase: us / 1e3 / self.steps for phase, us in per_phase.items()}
        self.step_ms = sum(self.ms.values())

    def top_other(self, counter: collections.Counter, n: int = 6) -> str:
        """The ``n`` largest entries of ``counter`` (us), in ms per step."""
        return ", ".join(f"{k} {us / 1e3 / self.steps:.2f}" for k, us in counter.most_common(n))


def write_profiler_files(prof: profile, impl: str, workload: str, out: Path, trace: bool) -> None:
    """The profiler's table (top 30 by self CPU time) and, with ``trace``, a chrome trace."""
    out.mkdir(parents=True, exist_ok=True)
    table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30)
    (out / f"profile_{workload}_{impl}.txt").write_text(table + "\n")
    if trace:
        prof.export_chrome_trace(str(out / f"profile_{workload}_{impl}.json"))


def record(rec: Recorder, config: Config, results: dict[str, Breakdown]) -> None:
    """One JSON line per (implementation, phase), dynemb's beside the peer's."""
    peer = results.get("torchrec")
    for impl, b in results.items():
        with_peer = peer if impl == "dynemb" else None
        for phase, value in [*b.ms.items(), ("step", b.step_ms)]:
            peer_value = None
            if with_peer is not None:
                peer_value = with_peer.step_ms if phase == "step" else with_peer.ms[phase]
            rec.add(
                config.workload, IMPLS[impl], f"ms_per_step[{phase}]@{config.optimizer}", value,
                threads=config.threads, peer=PEER_IMPL if with_peer else None,
                peer_value=peer_value,
            )  # fmt: skip


def table(config: Config, results: dict[str, Breakdown]) -> str:
    """The breakdown side by side (ms per step and share of the step), with notes."""
    header = ("phase", *[f"{IMPLS[i]} ms" for i in results], *[f"{i} %" for i in results])
    rows = []
    for phase in (*PHASES, "step"):
        cells, shares = [], []
        for impl, b in results.items():
            value = b.step_ms if phase == "step" else b.ms[phase]
            absent = impl == "torchrec" and phase in NOT_IN_TORCHREC and value == 0
            cells.append("n/a" if absent else f"{value:.2f}")
            shares.append(f"{100 * value / b.step_ms:.1f}")
        rows.append((phase, *cells, *shares))
    buf = io.StringIO()
    print(
        f"{config.workload} through DMP, world size 1, {config.optimizer}, {config.threads} "
        f"thread(s), {config.num_tables} tables, batch {config.batch}: ms per step "
        f"(mean of {config.steps} profiled steps) and share of the step",
        file=buf,
    )
    print_rows(header, rows, buf)
    for impl, b in results.items():
        print(f"{IMPLS[impl]} '{OTHER}' (ms/step), by stage: {b.top_other(b.other_stages)}",
              f"\n  main ops (a label: Python in it): {b.top_other(b.other_ops)}", file=buf)  # fmt: skip
    print(f"'{FUSED_BACKWARD}': one fused op in both, not separable", file=buf)
    if config.threads > 1 and "dynemb" in results:
        print("dynemb's dedup ran on its worker threads, unseen: it is in 'Python / other'",
              file=buf)  # fmt: skip
    return buf.getvalue()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes, 2 steps")
    parser.add_argument("--optimizer", choices=OPTIMIZERS, default="EXACT_ROWWISE_ADAGRAD")
    parser.add_argument("--only", choices=sorted(IMPLS), help="profile this implementation only")
    parser.add_argument("--steps", type=int, help="profiled steps (default 5, quick 2)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--trace", action="store_true", help="also write chrome traces")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "benchmark" / "out")
    add_workload_arguments(parser)
    args = parser.parse_args(argv)
    config = workload_config(
        args, optimizer=args.optimizer, threads=set_threads(args.threads),
        steps=args.steps or (2 if args.quick else 5), warmup=1 if args.quick else 3,
    )  # fmt: skip
    impls = [args.only] if args.only else list(IMPLS)
    if not has_peer(config) and "torchrec" in impls:
        print(f"{config.optimizer}: no CPU peer (fbgemm's CPU TBE); dynemb alone", file=sys.stderr)
        impls.remove("torchrec")
    results = {}
    for impl in impls:
        prof = profile_impl(impl, config)
        write_profiler_files(prof, impl, config.workload, args.out, args.trace)
        results[impl] = Breakdown(prof)
    record(Recorder(commit_hash()), config, results)
    text = table(config, results)
    (args.out / f"profile_{config.workload}.txt").write_text(text)
    print("\n" + text + f"files: {args.out}/profile_{config.workload}*", file=sys.stderr)


if __name__ == "__main__":
    main()
