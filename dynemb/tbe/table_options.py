"""Checks of a TBE module's per-table options, and the initializer lists it derives."""

import os
from collections.abc import Sequence

import torch

from dynemb import _ops
from dynemb.admission_strategies import AdmissionStrategy, Counter
from dynemb.config.table_options import DynamicEmbInitializerArgs, DynamicEmbTableOptions
from dynemb.config.types import DynamicEmbCheckMode
from dynemb.eviction_rules import EvictionRule
from dynemb.table.batch_arguments import strategy_code
from dynemb.table.protocol import Table

_INT64_MAX = 2**63 - 1


def table_names_of(table_names: Sequence[str] | None, count: int) -> list[str]:
    """The names of ``count`` tables: ``table_names``, or ``table_0``, ... when ``None``.

    Args:
        table_names: one name per table, each used once, or ``None``.
        count: the number of tables.

    Returns:
        The names, in table order.

    Raises:
        ValueError: ``table_names`` does not hold ``count`` names, or holds a name more
            than once (checkpoints and loads find a table by its name: two tables of one
            name would be saved as one, and one would be loaded into both).
    """
    if table_names is None:
        return [f"table_{i}" for i in range(count)]
    names = list(table_names)
    if len(names) != count:
        raise ValueError(f"table_names has {len(names)} names for {count} tables, got {names}")
    positions: dict[str, list[int]] = {}
    for i, name in enumerate(names):
        positions.setdefault(name, []).append(i)
    for name, at in positions.items():
        if len(at) > 1:
            raise ValueError(
                f"table_names must name each table once: {name!r} is at positions {at} "
                f"(got {names}); give every table its own name"
            )
    return names


def init_list(args: DynamicEmbInitializerArgs, table: Table) -> list:
    args.validate()
    # The table's column offset (its new rows and these missing rows: the same columns).
    resolved = (float(v) for v in args.resolved(table.max_capacity()))
    offset = _ops.Init(*table.init_values).column_offset
    return list(_ops.Init(*resolved, extra_value=0.0, column_offset=offset))


def admission_missing(strategy: AdmissionStrategy, table: Table) -> list:
    """Init list of keys not admitted: the strategy's initializer, else the table's own
    (a key then keeps the row it will start from once admitted)."""
    args = strategy.get_initializer_args()
    return table.init_values if args is None else init_list(args, table)


def check_options(name: str, o: DynamicEmbTableOptions) -> None:
    if not isinstance(o, DynamicEmbTableOptions):
        raise TypeError(f"table {name!r}: options must be DynamicEmbTableOptions, got {o!r}")
    if not isinstance(o.dim, int) or o.dim < 1:
        raise ValueError(f"table {name!r}: dim must be a positive int, got {o.dim!r}")
    if not isinstance(o.max_capacity, int) or not 1 <= o.max_capacity <= _INT64_MAX:
        raise ValueError(
            f"table {name!r}: max_capacity must be an int in [1, 2**63 - 1] (and its bytes "
            f"must fit in int64), got {o.max_capacity!r}"
        )
    if not isinstance(o.stochastic_rounding, bool):
        raise TypeError(
            f"table {name!r}: stochastic_rounding must be a bool, got {o.stochastic_rounding!r}"
        )
    if o.index_type not in (None, torch.int64):
        raise ValueError(f"table {name!r}: index_type must be torch.int64, got {o.index_type}")
    if not isinstance(o.safe_check_mode, DynamicEmbCheckMode):
        raise TypeError(f"table {name!r}: safe_check_mode must be a DynamicEmbCheckMode")
    if not isinstance(o.local_hbm_for_values, int) or o.local_hbm_for_values < 0:
        raise ValueError(
            f"table {name!r}: local_hbm_for_values must be an int >= 0 (bytes), "
            f"got {o.local_hbm_for_values!r}"
        )
    if o.spill_directory is not None and not isinstance(o.spill_directory, (str, os.PathLike)):
        raise TypeError(
            f"table {name!r}: spill_directory must be a path or None, got {o.spill_directory!r}"
        )
    check_admission(name, o)
    if o.eviction_rule is not None:
        if not isinstance(o.eviction_rule, EvictionRule):
            raise TypeError(
                f"table {name!r}: eviction_rule must be an EvictionRule or None, "
                f"got {o.eviction_rule!r}"
            )
        if o.caching and o.eviction_rule.load_factor_above is not None:
            raise ValueError(
                f"table {name!r}: EvictionRule.load_factor_above needs a table in memory "
                "(in caching mode the table's size takes a sync of the cache); use every_n_steps"
            )
        if o.score_strategy is not None:  # None: the kernel's default, checked at build
            o.eviction_rule.check(strategy_code(o.score_strategy), name)


def admission_counter_of(o: DynamicEmbTableOptions) -> Counter | None:
    """The counter a table counts with (a template: the table builds its own with
    ``create``): its strategy's ``counter``, else its (deprecated) ``admission_counter``,
    else None. None for a strategy that counts nothing (``counts_keys`` False)."""
    if not getattr(o.admit_strategy, "counts_keys", True):
        return None
    counter = getattr(o.admit_strategy, "counter", None)
    return counter if counter is not None else o.admission_counter


def check_admission(name: str, o: DynamicEmbTableOptions) -> None:
    """Raises TypeError / ValueError, naming the table, on admission options that cannot
    work: a strategy that is not an AdmissionStrategy, a counter that is not a Counter,
    or a strategy with no counter to read (neither its ``counter`` nor the table's
    ``admission_counter``). A counter without a strategy is accepted (as in DynamicEmb:
    every key is admitted)."""
    strategy, counter = o.admit_strategy, admission_counter_of(o)
    if strategy is not None and not isinstance(strategy, AdmissionStrategy):
        raise TypeError(
            f"table {name!r}: admit_strategy must be an AdmissionStrategy "
            f"(e.g. FrequencyAdmissionStrategy), got {strategy!r}"
        )
    if counter is not None and not isinstance(counter, Counter):
        raise TypeError(
            f"table {name!r}: the admission counter must be a Counter (e.g. KVCounter), "
            f"got {counter!r}"
        )
    if strategy is not None and counter is None and strategy.counts_keys:
        raise ValueError(
            f"table {name!r}: admit_strategy={strategy!r} has no counter to count keys "
            "with: pass one to the strategy, e.g. FrequencyAdmissionStrategy(threshold, "
            "counter=KVCounter(capacity))"
        )


__all__ = [
    "admission_counter_of",
    "admission_missing",
    "check_admission",
    "check_options",
    "init_list",
    "table_names_of",
]
