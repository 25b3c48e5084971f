"""Eviction by rule in the TBE module: each table's ``EvictionRule`` (its options'
``eviction_rule``) runs on a schedule, a bounded number of buckets per training
forward, and ``erase_stale`` runs a rule on demand (see dynemb.eviction_rules).

``StaleKeys`` is a part that a BatchedDynamicEmbeddingTables holds: it is given the
module's tables, their options and names, and keeps the passes under way.
"""

import dataclasses

from dynemb.eviction_rules import ErasedKeys, EvictionRule


@dataclasses.dataclass
class RulePass:
    """A pass of a table's rule under way: its thresholds (computed when it started)
    and the next bucket to scan."""

    thresholds: object
    next_bucket: int = 0


class StaleKeys:
    """Scheduled and on-demand eviction by rule over a module's tables.

    Args:
        tables: the module's tables (the Table protocol); ``table_options``: their
            options (each one's ``eviction_rule``); ``table_names``: their names.
    """

    def __init__(self, tables: list, table_options: list, table_names: list) -> None:
        self.tables = tables
        self.table_options = table_options
        self.table_names = table_names
        n = len(tables)
        for name, table, o in zip(self.table_names, self.tables, self.table_options, strict=True):
            if o.eviction_rule is not None:  # the kernel's default strategy is known now
                o.eviction_rule.check(table.strategy_code, name)
        #: Per table: the keys it erased by rule (dynemb.eviction_rules.erased_since).
        self.erased_by_rule = [ErasedKeys() for _ in range(n)]
        self._rule_passes: list[RulePass | None] = [None] * n
        self._rule_periods = [self.tables[t].score_step // _period(o) for t, o in
                              enumerate(self.table_options)]  # fmt: skip

    def erase_stale(self, rule: EvictionRule | None = None) -> dict[str, int]:
        """``BatchedDynamicEmbeddingTables.erase_stale`` (see its docstring)."""
        if rule is not None and not isinstance(rule, EvictionRule):
            raise TypeError(f"erase_stale: rule must be an EvictionRule or None, got {rule!r}")
        if rule is not None:
            for name, table in zip(self.table_names, self.tables, strict=True):
                rule.check(table.strategy_code, name)
        out = {}
        for t, name in enumerate(self.table_names):
            r = rule if rule is not None else self.table_options[t].eviction_rule
            if r is None:
                continue
            table = self.tables[t]
            self._rule_passes[t] = None
            erased = self._erase_buckets(t, table.rule_thresholds(r), 0, 1 << 62, started=True)
            out[name] = erased
        return out

    def scheduled_erase(self) -> None:
        """At a training forward's start: each table with a scheduled rule scans its
        next ``buckets_per_step`` buckets, starting a pass when its step has passed a
        multiple of ``every_n_steps`` or its load factor is above ``load_factor_above``."""
        for t, o in enumerate(self.table_options):
            rule = o.eviction_rule
            if rule is None or not rule.scheduled:
                continue
            table = self.tables[t]
            current = self._rule_passes[t]
            started = False
            if current is None:
                period = table.score_step // _period(o)
                due = rule.every_n_steps is not None and period > self._rule_periods[t]
                full = (
                    rule.load_factor_above is not None
                    and table.size() > rule.load_factor_above * table.capacity()
                )
                if not (due or full):
                    continue
                self._rule_periods[t] = period
                current = self._rule_passes[t] = RulePass(table.rule_thresholds(rule))
                started = True
            begin = current.next_bucket
            end = begin + rule.buckets_per_step
            current.next_bucket = end
            self._erase_buckets(t, current.thresholds, begin, end, started)

    def _erase_buckets(self, t: int, thresholds, begin: int, end: int, started: bool) -> int:
        """Erases table t's stale keys of buckets [begin, end); ends its pass when the
        range reaches the last bucket. Counts in the table's telemetry; returns the
        number erased."""
        table = self.tables[t]
        keys, buckets = table.erase_stale_buckets(thresholds, begin, end)
        self.erased_by_rule[t].add(keys)
        if end >= buckets:
            self._rule_passes[t] = None
        telemetry = table.telemetry
        telemetry.rule_passes += int(started)
        telemetry.rule_buckets += max(0, min(end, buckets) - min(begin, buckets))
        telemetry.rule_erased += keys.numel()
        return keys.numel()


def _period(o) -> int:
    """The schedule's period in table steps (1 when it has none: never compared)."""
    rule = o.eviction_rule
    return rule.every_n_steps if rule is not None and rule.every_n_steps else 1


__all__ = ["StaleKeys"]
