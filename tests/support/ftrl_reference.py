"""FTRL-Proximal in float64: a transcription of Algorithm 1 of McMahan et al. 2013 ("Ad
Click Prediction: a View from the Trenches"), per coordinate, with the paper's square
root generalised to n^(-learning_rate_power) (TensorFlow's and DynamicEmb's
learning_rate_power; -0.5 is the paper's).

The paper, for coordinate i with gradient g, learning rate alpha:
    sigma = (sqrt(n + g^2) - sqrt(n)) / alpha
    z += g - sigma * w
    n += g^2
and, for the next prediction,
    w = 0                                                 if |z| <= lambda1
    w = -(z - sign(z) * lambda1) / ((beta + sqrt(n)) / alpha + lambda2)   otherwise.
"""

import math


def ftrl_step(w, z, n, g, lr, power=-0.5, beta=0.0, l1=0.0, l2=0.0):
    """One update of one coordinate; every argument a Python float (float64). Returns
    ``(w, z, n)`` after it."""
    n_new = n + g * g
    sigma = (n_new ** (-power) - n ** (-power)) / lr
    z = z + g - sigma * w
    n = n_new
    if abs(z) <= l1:
        return 0.0, z, n
    return -(z - math.copysign(l1, z)) / ((beta + n ** (-power)) / lr + l2), z, n


def ftrl_weight(z, n, lr, power=-0.5, beta=0.0, l1=0.0, l2=0.0):
    """The weight the algorithm gives a coordinate of state ``(z, n)``."""
    if abs(z) <= l1:
        return 0.0
    return -(z - math.copysign(l1, z)) / ((beta + n ** (-power)) / lr + l2)


# The FTRL hyper-parameters tests train with (fused_params keys and module keywords).
FTRL_PARAMS = {
    "learning_rate_power": -0.4,
    "ftrl_beta": 0.5,
    "l1_reg": 0.05,
    "l2_reg": 0.01,
    "initial_accumulator_value": 0.1,
}


def optimizer_kwargs(optimizer: str) -> dict:
    """The extra hyper-parameters of an optimizer named as tests name them: FTRL's."""
    return dict(FTRL_PARAMS) if optimizer == "FTRL" else {}
