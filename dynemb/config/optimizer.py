"""Optimizers of dynamic tables: ``EmbOptimType`` is fbgemm's (same members, same object);
``DynamicEmbOptimType`` holds those fbgemm has no kernel for (DynamicEmb's enum: FTRL).

dynemb runs EXACT_SGD (and SGD, its alias), EXACT_ADAGRAD, EXACT_ROWWISE_ADAGRAD, ADAM
and FTRL fused into the backward pass; their state lives in each row's extra columns.
``dynemb.optimizer`` re-exports this module's names at DynamicEmb's path.
"""

import dataclasses
import enum
import numbers
import sys
from collections.abc import Sequence

import torch
from fbgemm_gpu.split_embedding_configs import EmbOptimType

from dynemb import _ops

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


class DynamicEmbOptimType(enum.Enum):
    """Optimizers of DynamicEmb's own (fbgemm's ``EmbOptimType`` has no kernel for them).

    FTRL: FTRL-Proximal (McMahan et al. 2013, Algorithm 1), per element; its state is
    the linear term then the accumulator (``2 * dim`` columns). Hyper-parameters
    ``learning_rate``, ``learning_rate_power``, ``ftrl_beta``, ``l1_reg``, ``l2_reg``,
    ``initial_accumulator_value`` (see OptimizerConfig).
    """

    FTRL = "ftrl"


# EmbOptimType -> kernel code of csrc/core/optimizer_rules.h (OptimizerKind).
_KERNEL_CODE = {
    EmbOptimType.SGD: _ops.OPTIMIZER_CODES["SGD"],
    EmbOptimType.EXACT_SGD: _ops.OPTIMIZER_CODES["SGD"],
    EmbOptimType.EXACT_ADAGRAD: _ops.OPTIMIZER_CODES["ADAGRAD"],
    EmbOptimType.EXACT_ROWWISE_ADAGRAD: _ops.OPTIMIZER_CODES["ROWWISE_ADAGRAD"],
    EmbOptimType.ADAM: _ops.OPTIMIZER_CODES["ADAM"],
    DynamicEmbOptimType.FTRL: _ops.OPTIMIZER_CODES["FTRL"],
}
SUPPORTED_OPTIMIZERS = tuple(_KERNEL_CODE)
OptimType = EmbOptimType | DynamicEmbOptimType


def optimizer_type_of(name: str) -> OptimType:
    """The optimizer of a name as checkpoints save it (``EmbOptimType`` member names, and
    ``FTRL``).

    Raises:
        ValueError: no optimizer has that name.

    Example::

        optimizer_type_of("FTRL")  # DynamicEmbOptimType.FTRL
    """
    if isinstance(name, str):
        if name in EmbOptimType.__members__:
            return EmbOptimType[name]
        if name in DynamicEmbOptimType.__members__:
            return DynamicEmbOptimType[name]
    names = [*EmbOptimType.__members__, *DynamicEmbOptimType.__members__]
    raise ValueError(f"optimizer must be one of {names}, got {name!r}")


@dataclasses.dataclass
class OptimizerConfig:
    """Hyper-parameters of the fused optimizer; mutable between steps (LR schedulers).

    Args:
        optimizer: one of SUPPORTED_OPTIMIZERS.
        learning_rate: step size (>= 0): a float, or a one-element tensor read at
            each update (so it may be changed in place). Every hyper-parameter must be
            finite.
        eps: added to the denominator of the Adagrads and Adam (> 0).
        beta1, beta2: Adam's moment decays, in [0, 1).
        weight_decay: L2 for SGD and the Adagrads (g += weight_decay * w), decoupled for
            Adam (w -= lr * weight_decay * w), as in fbgemm; FTRL takes none (0).
        learning_rate_power: FTRL's exponent p of the accumulator (<= 0; -0.5: the
            paper's square root): the step of a coordinate scales as n^p.
        ftrl_beta: FTRL's beta (>= 0), added to n^(-p) in the denominator.
        l1_reg: FTRL's L1 strength (>= 0): a weight whose |linear| <= l1_reg is 0.
        l2_reg: FTRL's L2 strength (>= 0), as in the paper and DynamicEmb:
            w = (sign(z) * l1 - z) / ((beta + n^(-p)) / lr + l2_reg); TensorFlow's
            kernel adds 2 * l2 instead (halve a TensorFlow l2 to port it).
        initial_accumulator_value: FTRL's accumulator n of a new row (>= 0; its linear
            term starts at 0). FTRL needs ``learning_rate`` > 0.
    """

    optimizer: OptimType
    learning_rate: float = 0.01
    eps: float = 1e-8
    beta1: float = 0.9
    beta2: float = 0.999
    weight_decay: float = 0.0
    learning_rate_power: float = -0.5
    ftrl_beta: float = 0.0
    l1_reg: float = 0.0
    l2_reg: float = 0.0
    initial_accumulator_value: float = 0.0

    def validate(self) -> None:
        """Raises ValueError naming the hyper-parameter that is not a finite number in its
        range (inf or NaN would turn every updated row into NaN). The TBE module calls it
        before each update, so a value changed in place (a one-element tensor
        ``learning_rate`` a scheduler mutates) is checked too."""
        if self.optimizer not in _KERNEL_CODE:
            names = ", ".join(o.name for o in SUPPORTED_OPTIMIZERS)
            raise ValueError(f"optimizer must be one of {names}; got {self.optimizer!r}")
        lr, eps, beta1, beta2, decay = (
            hyper_parameter(name, getattr(self, name))
            for name in ("learning_rate", "eps", "beta1", "beta2", "weight_decay")
        )
        if not lr >= 0:
            raise ValueError(f"learning_rate must be >= 0, got {lr}")
        if not eps > 0:
            raise ValueError(f"eps must be > 0, got {eps}")
        for name, v in (("beta1", beta1), ("beta2", beta2)):
            if not 0 <= v < 1:
                raise ValueError(f"{name} must be in [0, 1), got {v}")
        if not decay >= 0:
            raise ValueError(f"weight_decay must be >= 0, got {decay}")
        power, beta, l1, l2, accumulator = (
            hyper_parameter(name, getattr(self, name)) for name in _FTRL_FIELDS
        )
        if self.optimizer == DynamicEmbOptimType.FTRL:
            if not lr > 0:
                raise ValueError(f"learning_rate must be > 0 with FTRL (it divides), got {lr}")
            if not power <= 0:
                raise ValueError(f"learning_rate_power must be <= 0, got {power}")
            for name, v in (("ftrl_beta", beta), ("l1_reg", l1), ("l2_reg", l2)):
                if not v >= 0:
                    raise ValueError(f"{name} must be >= 0, got {v}")
            if not accumulator >= 0:
                raise ValueError(f"initial_accumulator_value must be >= 0, got {accumulator}")
            if decay != 0:
                raise ValueError(f"weight_decay must be 0 with FTRL (use l2_reg), got {decay}")
        elif accumulator != 0:
            raise ValueError(
                "initial_accumulator_value must be 0.0 except with FTRL (new rows start "
                f"with a zero optimizer state), got {accumulator}"
            )

    def state_columns(self, dim: int) -> int:
        """Extra columns this optimizer keeps per row of width ``dim``."""
        return _ops.state_columns(_KERNEL_CODE[self.optimizer], dim)

    def state_init(self, dim: int) -> tuple[float, int]:
        """``(value, zeros)``: a new row's state columns start at ``value``, but for the
        first ``zeros`` of them, at 0 (FTRL: linear 0, accumulator
        ``initial_accumulator_value``)."""
        if self.optimizer == DynamicEmbOptimType.FTRL:
            return float(self.initial_accumulator_value), dim
        return 0.0, 0

    def kernel_args(self, stochastic_rounding: bool = False, rounding_seed: int = 0) -> list:
        """The op argument ``optimizer``, after ``validate`` (the fields are mutable), for
        a table whose 16-bit rows round stochastically with ``rounding_seed`` (a whole
        number below 2**53), or to nearest.

        Raises:
            ValueError: as ``validate``.
        """
        self.validate()
        return list(self._kernel_tuple(stochastic_rounding, rounding_seed))

    def kernel_args_of_tables(self, roundings: Sequence[tuple[bool, int]]) -> list[list]:
        """``kernel_args(*r)`` for each ``r`` of ``roundings``, validated once: a step
        updates every table with the same hyper-parameters, only their rounding differs.

        Raises:
            ValueError: as ``validate``.
        """
        self.validate()
        base = self._kernel_tuple(False, 0)
        return [
            list(base._replace(stochastic_rounding=float(bool(s)), rounding_seed=float(seed)))
            for s, seed in roundings
        ]

    def _kernel_tuple(self, stochastic_rounding: bool, rounding_seed: int) -> _ops.OptimizerArgs:
        return _ops.OptimizerArgs(
            kind=float(_KERNEL_CODE[self.optimizer]),
            learning_rate=float(self.learning_rate),
            eps=float(self.eps),
            beta1=float(self.beta1),
            beta2=float(self.beta2),
            weight_decay=float(self.weight_decay),
            learning_rate_power=float(self.learning_rate_power),
            ftrl_beta=float(self.ftrl_beta),
            l1_reg=float(self.l1_reg),
            l2_reg=float(self.l2_reg),
            stochastic_rounding=float(bool(stochastic_rounding)),
            rounding_seed=float(rounding_seed),
        )


_FTRL_FIELDS = ("learning_rate_power", "ftrl_beta", "l1_reg", "l2_reg", "initial_accumulator_value")


def get_optimizer_state_dim(
    optimizer_type: OptimType, dim: int, dtype: torch.dtype | None = None
) -> int:
    """Optimizer-state elements a table keeps per row beside its ``dim`` embedding
    columns (DynamicEmb's function): a row holds ``dim + get_optimizer_state_dim(...)``
    elements of the table's dtype, as ``get_table_value_bytes`` counts them.

    ADAM ``2 * dim`` (m then v), ``DynamicEmbOptimType.FTRL`` ``2 * dim`` (linear then
    accumulator), EXACT_ADAGRAD ``dim``, EXACT_ROWWISE_ADAGRAD 1 (its
    accumulator: DynamicEmb reserves 16 bytes there, ``16 // dtype size`` elements),
    SGD / EXACT_SGD and optimizers dynemb does not run 0 (as DynamicEmb).

    Args:
        optimizer_type: an ``EmbOptimType`` or ``DynamicEmbOptimType``.
        dim: embedding columns of a row, an int >= 1.
        dtype: the table's embedding dtype; required with EXACT_ROWWISE_ADAGRAD (as in
            DynamicEmb), ignored otherwise.

    Raises:
        TypeError: ``optimizer_type`` is neither an EmbOptimType nor a DynamicEmbOptimType.
        ValueError: ``dim`` is not an int >= 1, or EXACT_ROWWISE_ADAGRAD without a
            ``dtype``.

    Example::

        get_optimizer_state_dim(EmbOptimType.ADAM, 16)  # 32
    """
    if not isinstance(optimizer_type, (EmbOptimType, DynamicEmbOptimType)):
        raise TypeError(
            f"get_optimizer_state_dim: `optimizer_type` must be an EmbOptimType or a "
            f"DynamicEmbOptimType, got {optimizer_type!r}"
        )
    if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
        raise ValueError(f"get_optimizer_state_dim: `dim` must be an int >= 1, got {dim!r}")
    if optimizer_type == EmbOptimType.EXACT_ROWWISE_ADAGRAD and dtype is None:
        raise ValueError(
            "get_optimizer_state_dim: `dtype` is required with EXACT_ROWWISE_ADAGRAD "
            "(the table's embedding dtype), got None"
        )
    if optimizer_type not in _KERNEL_CODE:
        return 0
    return _ops.state_columns(_KERNEL_CODE[optimizer_type], dim)


def hyper_parameter(name: str, value) -> float:
    """``value`` as a float: a real number or a one-element tensor, finite.

    Raises:
        ValueError: naming ``name``, for another type, a tensor of several elements, or
            inf / NaN.
    """
    if type(value) is float:  # the common case, without the abstract-class checks below
        if not abs(value) <= _FLOAT_MAX:
            raise ValueError(f"{name} must be a finite number, got {value!r}")
        return value
    if isinstance(value, torch.Tensor):
        if value.numel() != 1 or value.is_complex():
            raise ValueError(
                f"{name} must be a number or a one-element real tensor, got a tensor of "
                f"shape {tuple(value.shape)} and dtype {value.dtype}"
            )
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    exact = int(value) if isinstance(value, numbers.Integral) else float(value)
    if not abs(exact) <= _FLOAT_MAX:  # inf, NaN, or an int no float holds
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    return float(exact)


_FLOAT_MAX = sys.float_info.max


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
