"""λ, the ridge term of K = XᵀX + λI: a number (traker's absolute meaning) or ``"auto"``.

``auto`` picks λ per checkpoint from the spectrum of XᵀX, which is already factorised:

    λ = AUTO_SCALE · e_max,   e_max the largest eigenvalue of XᵀX,

so cond(XᵀX + λI) ≤ 1 + 1/AUTO_SCALE ≈ 144 whatever n and p: never singular (for XᵀX = 0,
where every λ gives zero scores, λ = 1). Relative to the spectrum, λ does not depend on the
gradients' units, on the 1/sqrt(d) factor or on how many rows or columns X has.

The rule and its constant were chosen by the LDS measured against 200 subset models on the
digits example's MLP, CNN and transformer at p = 512 < n = 1500 and p = 2048 ≥ n, with 1, 3 and
5 checkpoints (18 cases), scanning λ on a fine grid. Worst case over the 18, as a fraction of
each case's best LDS: λ = 0.007·e_max 0.974 (≥ 0.95 for constants 0.005 … 0.011);
λ giving 85 effective dimensions Σe/(e+λ) 0.973; λ = 1.26·trace/min(n, p) 0.963 (≥ 0.95 for
1.0 … 1.4); λ = 1.41·mean eigenvalue 0.955 (only at 1.4). Bergson's default, 0.1·mean
eigenvalue, reaches 0.71 at p ≥ n: these models want far more damping. The largest eigenvalue
is the simplest of the rules that keep a wide margin (``python -m benchmarks.lds_rules``);
``python -m benchmarks.lds`` checks it on fresh subset models (benchmarks/RESULTS.md).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from trak_dist.errors import ConfigError

AUTO = "auto"
AUTO_SCALE = 0.007

LambdaReg = float | str  # a number ≥ 0, or AUTO


def parse_lambda(value: Any, what: str = "lambda_reg") -> LambdaReg:
    """``value`` as a float ≥ 0 or ``"auto"``; anything else (NaN, inf, negative, other text,
    a bool) is a ConfigError naming it."""
    if isinstance(value, str):
        text = value.strip().lower()
        if text == AUTO:
            return AUTO
        try:
            value = float(text)
        except ValueError:
            raise ConfigError(
                f"{what}={value!r}; expected 'auto' or a finite number ≥ 0 (e.g. 0.01)."
            ) from None
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ConfigError(
            f"{what}={value!r} ({type(value).__name__}); expected 'auto' or a finite number ≥ 0."
        )
    number = float(value)
    if not math.isfinite(number) or number < 0:
        raise ConfigError(
            f"{what}={number}; expected 'auto' or a finite number ≥ 0 (λ = 0 is traker's "
            "default, 'auto' scales λ to the spectrum of XᵀX)."
        )
    return number


def auto_lambda(eigenvalues: np.ndarray) -> float:
    """The ``auto`` λ for XᵀX with ``eigenvalues`` ``[p]``."""
    top = float(np.max(eigenvalues)) if np.size(eigenvalues) else 0.0
    lam = AUTO_SCALE * top
    return lam if math.isfinite(lam) and lam > 0 else 1.0


def auto_rule() -> str:
    """The rule, as recorded next to scores computed with it."""
    return f"{AUTO_SCALE:g} × the largest eigenvalue of XᵀX"


def lambda_label(lambda_reg: LambdaReg) -> str:
    """``auto`` or the number as ``%g`` (the suffix of a variant's name)."""
    return AUTO if lambda_reg == AUTO else f"{float(lambda_reg):g}"
