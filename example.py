"""dynemb example: a DLRM with dynamic embedding tables, trained on synthetic clicks.

Usage::

    torchrun --nproc_per_node=2 example.py --train --eval            # dynamic tables
    torchrun --nproc_per_node=2 example.py --train --eval --static   # TorchRec tables only
    python example.py --train --eval                                 # one process
    torchrun --nproc_per_node=2 example.py --train --eval --caching --prefetch  # caching mode
    torchrun --nproc_per_node=2 example.py --train --dump            # then, at any world size:
    python example.py --load --eval                                  # the same held-out AUC
    torchrun --nproc_per_node=2 example.py --train --eval --publish_every 100  # base + deltas
    torchrun --nproc_per_node=2 example.py --train --stats           # tables' telemetry
    python examples/serve.py                                         # served: the same AUC

The model (``dynemb.models.SequenceDLRM``): a dense MLP, an EmbeddingBagCollection
of 7 pooled features, an EmbeddingCollection of 1 sequence feature (its rows
mean-pooled per sample), pairwise dot products and an over MLP. By default 6 pooled
tables and the sequence table are dynamic (``dynemb``: raw 63-bit ids, rows
inserted on first sight, sharded ROW_WISE with ``--dist_type``) and 1 pooled table
is an ordinary TorchRec table (ids are row indices in ``[0, vocab_size)``; dynamic
too with ``--optimizer ADAM`` on CPU, where fbgemm has no Adam); ``--static`` makes
every table an ordinary one (TABLE_WISE, FUSED kernel), as a peer. The data is ``dynemb.datasets.SyntheticClicks`` (W-quality's generator), of
which the default run uses half (``--num_train``: the first 500k of W-quality's 1M
training rows, all 100k held-out rows) so that it finishes in well under a minute
on 2 CPU cores (3 minutes at most on a busy machine).

The code follows NVIDIA DynamicEmb's example: tables on the meta device, a
constraint per table, the planner's plan, ``DistributedModelParallel`` with the
dynamic sharders, the embedding optimizer in the sharders' ``fused_params`` and a
torch optimizer over the dense parameters. Runs on CPU with gloo, or on GPUs with
NCCL when CUDA is present. This file is the command line; the builders (model, data,
training and evaluation loops, publishing) are ``dynemb._example``'s modules.
"""

import gc
import os
import socket
import sys
import time

import torch
import torch.distributed as dist

from dynemb._example import silence_known_notices
from dynemb._example.arguments import ORDINARY_FEATURE, parse_args, publish_refusal
from dynemb._example.data import dynamic_features, id_views, make_dataset, no_cpu_adam
from dynemb._example.loops import dump_checkpoint, evaluate_logits, load_checkpoint, train_epoch
from dynemb._example.model import build_model, dense_optimizer
from dynemb._example.publishing import ExamplePublisher
from dynemb._example.stats import print_stats, sample_every_step

__all__ = ["main", "parse_args", "publish_refusal"]

silence_known_notices()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.static and no_cpu_adam(args):
        print(
            "--static --optimizer ADAM: fbgemm's CPU TBE has no Adam (dynemb's tables do)",
            file=sys.stderr,
        )
        return 2
    if args.stats and args.static:
        print("--stats reports dynamic tables: --static has none", file=sys.stderr)
        return 2
    if (args.prefetch or args.caching) and args.static:
        print("--caching / --prefetch are options of dynamic tables, not --static", file=sys.stderr)
        return 2
    if args.prefetch and not args.caching:
        print("--prefetch fills the caches of --caching: pass both", file=sys.stderr)
        return 2
    refusal = publish_refusal(args)
    if refusal:
        print(refusal, file=sys.stderr)
        return 2
    start = time.perf_counter()
    cuda = torch.cuda.is_available()
    if "RANK" not in os.environ:  # plain `python example.py`: a world of one
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = str(s.getsockname()[1])
        os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    dist.init_process_group(backend="nccl" if cuda else "gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    torch.manual_seed(args.seed)
    lead = rank == 0
    try:
        data = make_dataset(args)
        views = id_views(args)
        model = build_model(args, data.num_dense, dist.group.WORLD, device)
        optimizer = dense_optimizer(model, args)
        if lead:
            if not args.static and no_cpu_adam(args):
                print(
                    f"note: ADAM on CPU: {ORDINARY_FEATURE} is dynamic too (fbgemm's CPU TBE, "
                    "which would hold the ordinary table, has no Adam)",
                    flush=True,
                )
            kind = "static (TorchRec)" if args.static else f"dynamic ({args.dist_type})"
            print(
                f"{world_size} rank(s) on {device.type}; tables: {kind}; optimizer "
                f"{args.optimizer}; {args.num_train} training rows, {args.num_eval} "
                f"held-out; Bayes AUC {data.bayes_auc('eval'):.4f}",
                flush=True,
            )
        if args.load:
            load_checkpoint(model, args)
        if args.stats:
            sample_every_step(model)
        publisher = None
        if args.publish_every:
            dynamic = {f"t_{f}" for f in dynamic_features(args)}
            publisher = ExamplePublisher(
                model, args.publish_dir, args.publish_every, dynamic, vars(args)
            )
            publisher.publish_base()
            if lead:
                print(f"published version 0 (the base) to {args.publish_dir}", flush=True)
        batches = dict(batch_size=args.batch_size, rank=rank, world_size=world_size, id_view=views)
        scores = []  # --scores_out

        def held_out(epoch: int) -> str:
            """Evaluates; the AUC (and the version it is) as printed."""
            auc, logits = evaluate_logits(
                model, data.batches("eval", **batches), device, "eval", lead
            )
            version = publisher.version if publisher is not None else None
            scores.append(dict(epoch=epoch, version=version, auc=auc, logits=logits))
            published = f" (published version {version})" if version is not None else ""
            return f"held-out AUC {auc:.4f}{published}"

        for epoch in range(1, args.epochs + 1) if args.train else ():
            loss = train_epoch(
                model,
                optimizer,
                data.batches("train", **batches),
                device,
                f"train {epoch}/{args.epochs}",
                lead,
                prefetch=args.prefetch,
                after_step=publisher.after_step if publisher is not None else None,
            )
            if publisher is not None:
                publisher.publish_pending()  # the epoch's last steps
            line = f"epoch {epoch}/{args.epochs}: train loss {loss:.4f}"
            if args.eval:
                line += ", " + held_out(epoch)
            if lead:
                print(line, flush=True)
            if args.stats:
                print_stats(model, f"epoch {epoch}/{args.epochs}", lead)
        if args.eval and not args.train:
            line = held_out(0)
            if lead:
                print(line, flush=True)
        if publisher is not None:
            publisher.close()
            if lead:
                print(
                    f"published versions 0..{publisher.version} to {args.publish_dir}", flush=True
                )
        if args.scores_out and lead:
            torch.save(scores, args.scores_out)
        if args.dump:
            dump_checkpoint(model, args)
        if lead:
            print(f"done in {time.perf_counter() - start:.1f} s", flush=True)
        # Every rank past its last collective before any tears the group down: a rank
        # whose peer closed the connections mid-collective aborts in gloo's threads.
        dist.barrier()
    finally:
        # The model's sharded modules hold the process group: released here, before the
        # group is torn down, and not at interpreter exit, where a rank now and then
        # aborted ("terminate called without an active exception") after its last line.
        model = optimizer = None
        gc.collect()
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
