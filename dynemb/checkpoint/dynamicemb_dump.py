"""Writes dynamic tables in NVIDIA DynamicEmb's checkpoint layout (see dynamicemb_layout.py),
so that a checkpoint of dynemb loads into DynamicEmb."""

import json
from pathlib import Path

import torch

from dynemb.checkpoint.exchange import route_rows
from dynemb.checkpoint.tables import NamedTable
from dynemb.config.optimizer import DynamicEmbOptimType, EmbOptimType
from dynemb.config.score_strategies import evict_strategy_of
from dynemb.distributed.collectives import all_gather, rank_and_size
from dynemb.dump_files.dynamicemb_layout import (
    FIELDS,
    OPT_ARGS,
    continuous_local_ids,
    file_name,
    opt_type_name,
    score_columns,
)
from dynemb.dump_files.format import CHUNK_ROWS, FieldWriter
from dynemb.dump_files.manifest import MANIFEST


def opt_args(t: NamedTable) -> dict:
    """The content of ``<table>_opt_args.json``."""
    config, table = t.group.optimizer_config, t.table
    args = {"opt_type": opt_type_name(config.optimizer), "lr": config.learning_rate}
    if config.optimizer == EmbOptimType.ADAM:
        args.update(
            iters=t.group.step,
            beta1=config.beta1,
            beta2=config.beta2,
            eps=config.eps,
            weight_decay=config.weight_decay,
        )
    elif config.optimizer in (EmbOptimType.EXACT_ADAGRAD, EmbOptimType.EXACT_ROWWISE_ADAGRAD):
        args.update(eps=config.eps, initial_accumulator_value=0.0)
    elif config.optimizer == DynamicEmbOptimType.FTRL:
        args.update(
            learning_rate_power=config.learning_rate_power,
            ftrl_beta=config.ftrl_beta,
            l1_reg=config.l1_reg,
            l2_reg=config.l2_reg,
            initial_accumulator_value=config.initial_accumulator_value,
        )
    args.update(
        evict_strategy=str(evict_strategy_of(table.score_strategy).value),
        dist_type=t.group.table_routing(t.index)[0],
        step_score=table.score_step,
    )
    if table.score_half_life_steps is not None:  # dynemb's DECAYED_LFU (DynamicEmb has none)
        args.update(score_half_life_steps=table.score_half_life_steps)
    return args


def remove_saved_files(directory: Path, table: str) -> None:
    """Removes the files of ``table`` a previous dump left in ``directory`` (any world size)."""
    stems = [stem for stem, _ in FIELDS.values()]
    for file in directory.glob(f"{table}_*"):
        rest = file.name[len(table) + 1 :]
        if any(rest.startswith(stem + ".rank_") for stem in stems) or rest == "opt_args.json":
            file.unlink()


def prepare_directory(path: Path, tables: list[NamedTable]) -> None:
    """Rank 0, before anyone writes: the collection directories exist, hold no file of
    a table about to be written, and ``path`` holds no dynemb manifest (which loads
    would read first)."""
    (path / MANIFEST).unlink(missing_ok=True)
    for t in tables:
        directory = path / t.public_collection
        directory.mkdir(parents=True, exist_ok=True)
        remove_saved_files(directory, t.table_name)


def write_table(path: Path, t: NamedTable, optim: bool, counter, pg) -> None:
    """Writes this rank's files of one table (and, on rank 0, its ``opt_args.json``).

    Under ``continuous`` every key is first sent to the rank DynamicEmb's routing gives
    it (dynemb's rule differs for keys outside ``[0, num_embeddings)``), whose files
    then hold its local id; every rank of ``pg`` must call this.

    Args:
        path: the checkpoint directory.
        t: the table.
        optim: also write the optimizer state (``<table>_emb_opt_values``).
        counter: the table's admission counter to write, or None.
        pg: the group of the model's ranks (None: one process).
    """
    rank, world_size = rank_and_size(pg)
    table, directory = t.table, path / t.public_collection
    dist_type, num_embeddings = t.group.table_routing(t.index)
    local_ids = dist_type == "continuous"
    state = optim and t.group.optimizer_config.state_columns(table.dim) > 0
    columns = score_columns(table.score_strategy)
    fields = {
        "keys": (torch.int64, 0),
        "values": (torch.float32, table.dim),
        "scores": (torch.int64, len(columns)),
    }
    if state:
        fields["state"] = (torch.float32, t.group.optimizer_config.state_columns(table.dim))
    writers = {
        f: FieldWriter(directory / file_name(t.table_name, f, rank, world_size)) for f in fields
    }
    starts = list(range(0, table.capacity(), CHUNK_ROWS))
    rounds = max(all_gather(len(starts), pg)) if local_ids else len(starts)
    now = table.now()
    for k in range(rounds):
        chunk = _chunk(table, starts[k], state, columns, now) if k < len(starts) else None
        if local_ids:
            chunk = _to_dynamicemb_owner(t, fields, chunk, pg, world_size, num_embeddings)
        if chunk is not None:
            for field, data in chunk.items():
                writers[field].write(data)
    for w in writers.values():
        w.close()
    if counter is not None:
        keys, counts = counter.dump()
        if local_ids:  # a counter's keys stay where they are: rank and id as DynamicEmb's
            keys = continuous_local_ids(keys, world_size, num_embeddings)[1]
        for field, data in (("counter_keys", keys), ("counter_counts", counts)):
            w = FieldWriter(directory / file_name(t.table_name, field, rank, world_size))
            w.write(data.to(torch.int64))
            w.close()
    if rank == 0:
        with open(directory / OPT_ARGS.format(table=t.table_name), "w") as f:
            json.dump(opt_args(t), f, indent=1)


def _chunk(table, begin: int, state: bool, columns: list[str], now: int) -> dict:
    """Slots [begin, begin + CHUNK_ROWS) in DynamicEmb's types: float32 rows, int64
    score columns (a TIMESTAMP score as its age ``now - last access``)."""
    keys, values, scores, _ = table.export_batch(begin, CHUNK_ROWS, include_extra=state)
    saved = {"raw": scores}
    if table.keeps_timestamps:
        saved["age"] = (now - table.get_timestamps(keys)).clamp(min=0)
    elif columns == ["age"]:
        saved = {"age": (now - scores).clamp(min=0)}
    elif not table.keeps_scores:
        saved = {"raw": torch.zeros_like(keys)}  # NO_EVICTION keeps none: DynamicEmb's 0
    chunk = {
        "keys": keys,
        "values": values[:, : table.dim].float().contiguous(),
        "scores": torch.stack([saved[c] for c in columns], dim=1),
    }
    if state:
        chunk["state"] = values[:, table.dim :].float().contiguous()
    return chunk


def _to_dynamicemb_owner(t, fields, chunk, pg, world_size: int, num_embeddings: int):
    """Sends the rows to their owner under DynamicEmb's continuous routing; returns the
    rows received, keys replaced by their local ids."""
    owner = None
    if chunk is not None:
        owner = continuous_local_ids(chunk["keys"], world_size, num_embeddings)[0]
    got = route_rows(t, fields, chunk, pg, world_size, owner=owner)
    got["keys"] = continuous_local_ids(got["keys"], world_size, num_embeddings)[1]
    return got


__all__ = ["opt_args", "prepare_directory", "write_table"]
