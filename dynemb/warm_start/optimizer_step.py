"""The optimizer step a module starts from when its tables warm-start with optimizer
state.

A module keeps one optimizer step for all its tables (``step``: Adam's bias
correction counts it); a dump records it (``optimizer_step``, DynamicEmb's
``iters``) and DynamicEmbLoad(optim=True) restores it with the rows' state. A warm
start that takes a dump's state carries its step the same way, so the next updates
equal those of the loaded model: from step 1 again, Adam would bias-correct the
saved moments as new ones (divide them by 1 - beta1 and 1 - beta2).
"""

import warnings
from collections.abc import Callable, Sequence


def carried_step(names: Sequence[str], options: Sequence, state_columns: Callable) -> int:
    """The step of a module of tables ``names`` built from ``options``
    (DynamicEmbTableOptions, each with its ``warm_start`` and ``dim``), whose optimizer
    keeps ``state_columns(dim)`` state columns: the ``optimizer_step`` of the sources
    whose state the tables take (a source of the table's state width), else 0.

    Sources of different steps: the largest, with a warning. One step serves every
    table of the module; a bias correction divides by ``1 - beta ** step``, so the
    largest step under-corrects the other tables' moments slightly (a smaller one
    would inflate the larger step's).
    """
    steps = {}
    for name, o in zip(names, options, strict=True):
        source = o.warm_start
        if source is None or source.optimizer_step is None:
            continue
        if source.state_columns and source.state_columns == state_columns(o.dim):
            steps[name] = source.optimizer_step
    if not steps:
        return 0
    step = max(steps.values())
    if len(set(steps.values())) > 1:
        warnings.warn(
            f"warm_start: the sources of tables {sorted(steps)} were dumped at optimizer "
            f"steps {steps}; the module keeps one step for all its tables and takes {step} "
            "(Adam's bias correction of the others' state is then slightly off); to avoid "
            "it, warm-start them from one dump or put them in separate modules",
            stacklevel=3,
        )
    return step


__all__ = ["carried_step"]
