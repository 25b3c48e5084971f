"""DynamicEmb's ``dynamicemb.optimizer``: ``EmbOptimType`` (fbgemm's), ``OptimizerArgs``,
and dynemb's ``OptimizerConfig``, ``SUPPORTED_OPTIMIZERS``, ``get_optimizer_state_dim``,
``hyper_parameter``.

A front module: it re-exports ``dynemb.config.optimizer`` and no module of dynemb
imports it.
"""

from dynemb.config.optimizer import (
    SUPPORTED_OPTIMIZERS,
    EmbOptimType,
    OptimizerArgs,
    OptimizerConfig,
    get_optimizer_state_dim,
    hyper_parameter,
)

__all__ = [
    "EmbOptimType",
    "OptimizerArgs",
    "OptimizerConfig",
    "SUPPORTED_OPTIMIZERS",
    "get_optimizer_state_dim",
    "hyper_parameter",
]
