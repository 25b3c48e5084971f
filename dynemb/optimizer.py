"""DynamicEmb's ``dynamicemb.optimizer``: ``EmbOptimType`` (fbgemm's), ``DynamicEmbOptimType``
(FTRL), ``OptimizerArgs``, and dynemb's ``OptimizerConfig``, ``SUPPORTED_OPTIMIZERS``,
``get_optimizer_state_dim``, ``hyper_parameter``, ``optimizer_type_of``.

A front module: it re-exports ``dynemb.config.optimizer`` and no module of dynemb
imports it.
"""

from dynemb.config.optimizer import (
    SUPPORTED_OPTIMIZERS,
    DynamicEmbOptimType,
    EmbOptimType,
    OptimizerArgs,
    OptimizerConfig,
    get_optimizer_state_dim,
    hyper_parameter,
    optimizer_type_of,
)

__all__ = [
    "DynamicEmbOptimType",
    "EmbOptimType",
    "OptimizerArgs",
    "OptimizerConfig",
    "SUPPORTED_OPTIMIZERS",
    "get_optimizer_state_dim",
    "hyper_parameter",
    "optimizer_type_of",
]
