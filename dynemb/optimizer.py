"""Optimizers of dynamic tables: ``EmbOptimType`` is fbgemm's (same members, same object).

dynemb runs EXACT_SGD (and SGD, its alias), EXACT_ADAGRAD, EXACT_ROWWISE_ADAGRAD and
ADAM fused into the backward pass; their state lives in each row's extra columns.
"""

import dataclasses

from fbgemm_gpu.split_embedding_configs import EmbOptimType

from dynemb import _ops

__all__ = ["EmbOptimType", "OptimizerArgs", "OptimizerConfig", "SUPPORTED_OPTIMIZERS"]

# EmbOptimType -> kernel code of csrc/core/optimizer_rules.h (OptimizerKind).
_KERNEL_CODE = {
    EmbOptimType.SGD: _ops.OPTIMIZER_CODES["SGD"],
    EmbOptimType.EXACT_SGD: _ops.OPTIMIZER_CODES["SGD"],
    EmbOptimType.EXACT_ADAGRAD: _ops.OPTIMIZER_CODES["ADAGRAD"],
    EmbOptimType.EXACT_ROWWISE_ADAGRAD: _ops.OPTIMIZER_CODES["ROWWISE_ADAGRAD"],
    EmbOptimType.ADAM: _ops.OPTIMIZER_CODES["ADAM"],
}
SUPPORTED_OPTIMIZERS = tuple(_KERNEL_CODE)


@dataclasses.dataclass
class OptimizerConfig:
    """Hyper-parameters of the fused optimizer; mutable between steps (LR schedulers).

    Args:
        optimizer: one of SUPPORTED_OPTIMIZERS.
        learning_rate: step size (>= 0).
        eps: added to the denominator of the Adagrads and Adam (> 0).
        beta1, beta2: Adam's moment decays, in [0, 1).
        weight_decay: L2 for SGD and the Adagrads (g += weight_decay * w), decoupled for
            Adam (w -= lr * weight_decay * w), as in fbgemm.
    """

    optimizer: EmbOptimType
    learning_rate: float = 0.01
    eps: float = 1e-8
    beta1: float = 0.9
    beta2: float = 0.999
    weight_decay: float = 0.0

    def validate(self) -> None:
        if self.optimizer not in _KERNEL_CODE:
            names = ", ".join(o.name for o in SUPPORTED_OPTIMIZERS)
            raise ValueError(f"optimizer must be one of {names}; got {self.optimizer!r}")
        if not self.learning_rate >= 0:
            raise ValueError(f"learning_rate must be >= 0, got {self.learning_rate}")
        if not self.eps > 0:
            raise ValueError(f"eps must be > 0, got {self.eps}")
        for name in ("beta1", "beta2"):
            v = getattr(self, name)
            if not 0 <= v < 1:
                raise ValueError(f"{name} must be in [0, 1), got {v}")
        if not self.weight_decay >= 0:
            raise ValueError(f"weight_decay must be >= 0, got {self.weight_decay}")

    def state_columns(self, dim: int) -> int:
        """Extra columns this optimizer keeps per row of width ``dim``."""
        return _ops.state_columns(_KERNEL_CODE[self.optimizer], dim)

    def kernel_args(self) -> list:
        """The op argument ``optimizer``."""
        return [
            float(_KERNEL_CODE[self.optimizer]),
            float(self.learning_rate),
            float(self.eps),
            float(self.beta1),
            float(self.beta2),
            float(self.weight_decay),
        ]


@dataclasses.dataclass
class OptimizerArgs:
    """DynamicEmb's bag of optimizer hyper-parameters (fields and defaults as in
    DynamicEmb). dynemb's fused optimizers read ``learning_rate``, ``eps``, ``beta1``,
    ``beta2`` and ``weight_decay`` (see ``OptimizerConfig``); the other fields are
    kept for compatibility.

    Example::

        OptimizerArgs(learning_rate=0.05).learning_rate  # 0.05
    """

    stochastic_rounding: bool = True
    gradient_clipping: bool = False
    max_gradient: float = 1.0
    max_norm: float = 0.0
    learning_rate: float = 0.01
    eps: float = 1.0e-8
    initial_accumulator_value: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.999
    weight_decay: float = 0.0
    weight_decay_mode: int = 0
    eta: float = 0.001
    momentum: float = 0.9
    counter_halflife: int = -1
    adjustment_iter: int = -1
    adjustment_ub: float = 1.0
    learning_rate_mode: int = -1
    grad_sum_decay: int = -1
    tail_id_threshold: float = 0
    is_tail_id_thresh_ratio: int = 0
    total_hash_size: int = 0
    weight_norm_coefficient: float = 0
    lower_bound: float = 0
    regularization_mode: int = 0
