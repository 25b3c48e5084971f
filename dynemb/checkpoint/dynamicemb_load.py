"""Loads a checkpoint in NVIDIA DynamicEmb's layout (see dynamicemb_layout.py) at any
world size and dist_type: validate every file first, then route every key to its owner."""

import dataclasses
from pathlib import Path

import torch

from dynemb.checkpoint.dynamicemb_content import content_errors
from dynemb.checkpoint.exchange import (
    RESTORE_THREADS,
    StepLimits,
    op_threads,
    prepare_tables,
    report_dropped,
    restore_rows,
    restored_step,
    route_rows,
)
from dynemb.checkpoint.tables import NamedTable, admission_counter, named_tables
from dynemb.config.score_strategies import evict_strategy_of
from dynemb.distributed.collectives import all_gather, rank_and_size
from dynemb.dump_files.dynamicemb_layout import (
    OPT_ARGS,
    SavedShard,
    SavedTable,
    continuous_keys,
    opt_type_name,
    read_field,
    read_opt_args,
    saved_tables,
    score_columns,
    validate_table,
)
from dynemb.dump_files.format import CHUNK_ROWS, CheckpointError

_HYPER_PARAMETERS = {  # opt_args.json key -> OptimizerConfig field
    "lr": "learning_rate",
    "beta1": "beta1",
    "beta2": "beta2",
    "eps": "eps",
    "weight_decay": "weight_decay",
    # FTRL's. Its initial_accumulator_value is not loaded: it is the state of rows not
    # yet stored, fixed when the tables are built (as their initializer).
    "learning_rate_power": "learning_rate_power",
    "ftrl_beta": "ftrl_beta",
    "l1_reg": "l1_reg",
    "l2_reg": "l2_reg",
}


def _routing(t: NamedTable) -> tuple[str, int]:
    return t.group.table_routing(t.index)


def _check_opt_args(t: NamedTable, directory: Path, optim: bool, allow_mismatch: bool):
    """Reads and checks the table's ``opt_args.json``; returns ``(args, errors, load the
    optimizer state and hyper-parameters?)``. ``args`` is ``{}`` when there is none."""
    file = directory / OPT_ARGS.format(table=t.table_name)
    args, errors = read_opt_args(directory, t.table_name)
    if args is None:
        return {}, errors or ([f"{file}: missing (needed with optim=True)"] if optim else []), False
    mine = str(evict_strategy_of(t.table.score_strategy).value)
    if "evict_strategy" in args and args["evict_strategy"] != mine:
        errors.append(
            f"{file}: evict_strategy {args['evict_strategy']!r}, the model's table "
            f"{t.name!r} evicts by {mine!r} (score_strategy {t.table.score_strategy})"
        )
    half_life = args.get("score_half_life_steps")
    if half_life != t.table.score_half_life_steps:  # decayed scores of another half-life
        errors.append(
            f"{file}: score_half_life_steps {half_life!r}, the model's table {t.name!r} "
            f"has {t.table.score_half_life_steps!r}"
        )
    dist_type = args.get("dist_type", _routing(t)[0])
    if dist_type not in ("roundrobin", "hash_roundrobin", "continuous"):
        errors.append(f"{file}: unknown dist_type {dist_type!r}")
    elif dist_type == "continuous" and not _routing(t)[1]:
        errors.append(
            f"{file}: dist_type continuous, whose saved ids need the table's num_embeddings; "
            f"the model does not give one for {t.name!r} (load it into a sharded model)"
        )
    for key in _HYPER_PARAMETERS:
        if key in args and (isinstance(args[key], bool) or not isinstance(args[key], int | float)):
            errors.append(f"{file}: {key} must be a number, got {args[key]!r}")
    limits = StepLimits.of(t)
    steps = {  # key -> (largest value, why)
        "iters": (limits.optimizer, "the next step must fit an int64"),
        "step_score": (limits.score, limits.score_rule),
    }
    for key, (high, why) in steps.items():
        value = args.get(key, 0)
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= high:
            errors.append(f"{file}: {key} must be an integer in [0, {high}] ({why}), got {value!r}")
    if not optim:
        return args, errors, False
    model_opt = opt_type_name(t.group.optimizer_config.optimizer)
    if args.get("opt_type") == model_opt:
        return args, errors + _hyper_parameter_errors(t, file, args), True
    if not allow_mismatch:
        errors.append(
            f"{file}: opt_type {args.get('opt_type')!r}, the model trains {t.name!r} with "
            f"{model_opt!r}; pass allow_optimizer_mismatch=True to load rows only"
        )
    return args, errors, False


def _hyper_parameter_errors(t: NamedTable, file: Path, args: dict) -> list[str]:
    """The saved hyper-parameters the model's optimizer would refuse at its next step
    (OptimizerConfig.validate): with optim=True they replace the model's."""
    errors = []
    for key, field in _HYPER_PARAMETERS.items():
        value = args.get(key)
        if isinstance(value, bool) or not isinstance(value, int | float):
            continue  # absent, or not a number (refused above)
        try:
            dataclasses.replace(t.group.optimizer_config, **{field: value}).validate()
        except ValueError as e:
            errors.append(f"{file}: {key} {value!r} cannot be trained with ({e})")
    return errors


def _validate(path: Path, tables: list[NamedTable], table_names, optim, counter, allow_mismatch):
    """Every check before any table changes; returns ``(errors, [(table, saved files,
    opt args, load the optimizer?)])``."""
    errors, plans = [], []
    if table_names is None:
        mine = {(t.public_collection, t.table_name) for t in tables}
        extra = sorted(saved_tables(path) - mine)
        if extra:
            errors.append(f"{path}: saved tables {extra} are not dynamic tables of the model")
    for t in tables:
        directory = path / t.public_collection
        args, opt_errors, with_optim = _check_opt_args(t, directory, optim, allow_mismatch)
        errors.extend(opt_errors)
        state = t.group.optimizer_config.state_columns(t.table.dim) if with_optim else 0
        width = len(score_columns(t.table.score_strategy))
        saved, table_errors = validate_table(
            directory, t.table_name, t.table.dim, width, state, counter
        )
        errors.extend(table_errors)
        if saved is not None and not opt_errors:
            errors.extend(content_errors(saved, _KeyConversion(t, saved, args), width, counter))
        if saved is not None:
            plans.append((t, saved, args, with_optim))
    return errors, plans


def load_dynamicemb_layout(
    path: Path,
    model,
    table_names,
    optim: bool,
    counter: bool,
    pg,
    allow_optimizer_mismatch: bool,
    merge: bool = False,
    strict: bool = False,
) -> None:
    """DynamicEmbLoad of a directory in DynamicEmb's layout (arguments as DynamicEmbLoad)."""
    rank, world_size = rank_and_size(pg)
    tables = named_tables(model, table_names)
    errors, plans = _validate(path, tables, table_names, optim, counter, allow_optimizer_mismatch)
    errors = all_gather(errors, pg)[0]  # every rank sees the same files: rank 0 decides
    if errors:
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise CheckpointError(errors[0] + more)
    failed = {}
    for t, _, _, _ in plans:
        prepare_tables(t, merge, counter)
    with op_threads(RESTORE_THREADS):
        for t, saved, args, with_optim in plans:
            share = saved.shards[rank::world_size]
            keys_of = _KeyConversion(t, saved, args)
            failed[t.name] = _load_rows(t, share, keys_of, with_optim, pg, world_size)
            if counter:
                _load_counter(t, share, keys_of, pg, world_size)
            if "step_score" in args:
                t.table.score_step = restored_step(t.table.score_step, args["step_score"], merge)
            if with_optim:
                _load_hyper_parameters(t, args, merge)
    report_dropped(failed, [t for t, _, _, _ in plans], strict, pg)


def _load_hyper_parameters(t: NamedTable, args: dict, merge: bool) -> None:
    """DynamicEmb's rule: with optim=True the saved hyper-parameters replace the model's."""
    config = t.group.optimizer_config
    for key, field in _HYPER_PARAMETERS.items():
        if key in args:
            setattr(config, field, float(args[key]))
    if "iters" in args:
        t.group.step = restored_step(t.group.step, args["iters"], merge)


class _KeyConversion:
    """Raw keys from the ids a saved shard holds (local ids under ``continuous``)."""

    def __init__(self, t: NamedTable, saved: SavedTable, args: dict) -> None:
        self.continuous = args.get("dist_type", _routing(t)[0]) == "continuous"
        self.world_size = saved.world_size
        self.num_embeddings = _routing(t)[1]

    def __call__(self, shard: SavedShard, ids: torch.Tensor) -> torch.Tensor:
        if not self.continuous:
            return ids
        return continuous_keys(ids, shard.rank, self.world_size, self.num_embeddings)


def _load_rows(t, share: list, keys_of, with_optim: bool, pg, world_size: int) -> int:
    """Reads this rank's share of the files chunk by chunk, routes and restores; returns
    the rows it dropped (restore_rows). Every rank joins every exchange, with an empty chunk if need be."""
    table = t.table
    state = t.group.optimizer_config.state_columns(table.dim) if with_optim else 0
    columns = score_columns(table.score_strategy)
    fields = {
        "keys": (torch.int64, 0),
        "values": (table.value_dtype, table.dim),
        "scores": (torch.int64, len(columns)),
    }
    if state:
        fields["state"] = (table.value_dtype, state)
    chunks = [
        (s, b, min(b + CHUNK_ROWS, s.rows)) for s in share for b in range(0, s.rows, CHUNK_ROWS)
    ]
    rounds = max(all_gather(len(chunks), pg))
    failed = 0
    for k in range(rounds):
        local = None
        if k < len(chunks):
            shard, begin, end = chunks[k]
            local = {
                "keys": keys_of(shard, read_field(shard, "keys", begin, end, 0)),
                "values": read_field(shard, "values", begin, end, table.dim).to(table.value_dtype),
                "scores": read_field(shard, "scores", begin, end, len(columns)),
            }
            if state:
                local["state"] = read_field(shard, "state", begin, end, state).to(table.value_dtype)
        rows = route_rows(t, fields, local, pg, world_size)
        failed += restore_rows(t, fields, _with_scores(table, columns, rows))
    return failed


def _with_scores(table, columns: list[str], rows: dict) -> dict:
    """Turns the saved score columns into the table's scores (and timestamps): an age
    becomes ``max(now - age, 0)``; a table without scores (NO_EVICTION) drops them."""
    saved = rows.pop("scores").reshape(-1, len(columns))
    now = table.now()
    values = [(now - c).clamp(min=0) if kind == "age" else c for kind, c in zip(columns, saved.T)]
    if table.keeps_timestamps:
        rows["timestamps"] = values[columns.index("age")].contiguous()
        rows["scores"] = values[columns.index("raw")].contiguous()
    elif table.keeps_scores:
        rows["scores"] = values[0].contiguous()
    return rows


def _load_counter(t, share: list, keys_of, pg, world_size: int) -> None:
    """Admission counts: each saved count goes to the owner of its key, like the rows."""
    counter = admission_counter(t)
    keys, counts = [], []
    for shard in share:
        if counter is not None and shard.counter_rows:
            n = shard.counter_rows
            keys.append(keys_of(shard, read_field(shard, "counter_keys", 0, n, 0)))
            counts.append(read_field(shard, "counter_counts", 0, n, 0))
    if not max(all_gather(counter is not None, pg)):  # the same collectives everywhere
        return
    empty = torch.empty(0, dtype=torch.int64)
    local = {
        "keys": torch.cat(keys) if keys else empty,
        "counts": torch.cat(counts) if counts else empty,
    }
    fields = {"keys": (torch.int64, 0), "counts": (torch.int64, 0)}
    received = route_rows(t, fields, local, pg, world_size)
    if counter is not None and received["keys"].numel():
        counter.load(received["keys"], received["counts"])


__all__ = ["load_dynamicemb_layout"]
