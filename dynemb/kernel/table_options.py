"""Checks of a kernel's per-table options, and the initializer lists it derives."""

import os

import torch

from dynemb.admission import AdmissionStrategy, Counter
from dynemb.dynamicemb_config import DynamicEmbInitializerArgs, DynamicEmbTableOptions
from dynemb.table.protocol import Table
from dynemb.types import DynamicEmbCheckMode

_INT64_MAX = 2**63 - 1


def init_list(args: DynamicEmbInitializerArgs, table: Table) -> list:
    args.validate()
    return [float(v) for v in args.resolved(table.max_capacity())] + [0.0]


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


def check_admission(name: str, o: DynamicEmbTableOptions) -> None:
    strategy, counter = o.admit_strategy, o.admission_counter
    if (strategy is None) != (counter is None):
        raise ValueError(
            f"table {name!r}: admission needs both admit_strategy and admission_counter, "
            f"got admit_strategy={strategy!r}, admission_counter={counter!r}"
        )
    if strategy is not None and not isinstance(strategy, AdmissionStrategy):
        raise TypeError(
            f"table {name!r}: admit_strategy must be an AdmissionStrategy "
            f"(e.g. FrequencyAdmissionStrategy), got {strategy!r}"
        )
    if counter is not None and not isinstance(counter, Counter):
        raise TypeError(
            f"table {name!r}: admission_counter must be a Counter (e.g. KVCounter), got {counter!r}"
        )


__all__ = ["admission_missing", "check_admission", "check_options", "init_list"]
