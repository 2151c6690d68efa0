"""XᵀX and its one factorisation per (checkpoint, proj_dim), serving every λ."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from trak_dist.errors import ConfigError, IllConditionedError, NonFiniteError
from trak_dist.scoring._lambda import AUTO, BEST, LambdaReg, auto_lambda, is_token_fisher
from trak_dist.store import FeatureSpec

logger = logging.getLogger(__name__)
# per_target: K⁻¹ unscaled, then each target's y_tc = K_c⁻¹ x_tc divided by √(y_tcᵀ XᵀX y_tc), the
# norm of its column of S_c: every checkpoint weighs the same in each target's mean
# (docs/design.md, "Checkpoint weights"); auto: per_target for a causal LM's Fisher, else mean_abs
KINV_SCALINGS = ("auto", "mean_abs", "none", "per_target")
WARN_CONDITION = 1e8


def gram(x: np.ndarray | torch.Tensor, device: torch.device | str = "cpu") -> np.ndarray:
    """XᵀX in float64 of rows ``x`` ``[rows, p]`` as stored (so partial sums add up exactly
    the same whichever worker computed them)."""
    t = torch.as_tensor(x).to(device=device, dtype=torch.float64)
    return (t.T @ t).cpu().numpy()


def _damaged(context: str) -> str:
    return (
        f"XᵀX{f' ({context})' if context else ''} or its eigenvalues hold NaN/inf: the stored "
        "features it was built from are damaged (non-finite rows are never committed). "
        "Featurise again into a new store (or store.overwrite=true)."
    )


def resolve_kinv_scaling(scaling: str, spec: FeatureSpec) -> str:
    """``scoring.kinv_scaling`` for scores of the store with ``spec``: ``auto`` is
    ``per_target`` for a causal LM's sampled-label Fisher (each checkpoint weighs the same in
    every target's mean: +0.041 LDS on the 3-checkpoint Llama benchmark, +0.003–0.004 on the
    GPT-2 ones, fact MRR unchanged; docs/decisions.md, "Checkpoints weigh the same") and traker's
    ``mean_abs`` elsewhere (not measured better there); any other value as it is;
    ConfigError for an unknown one."""
    if scaling not in KINV_SCALINGS:
        raise ConfigError(f"kinv_scaling={scaling!r}; expected one of {KINV_SCALINGS}.")
    if scaling != AUTO:
        return scaling
    return "per_target" if is_token_fisher(spec) else "mean_abs"


def check_lambda(lambda_reg: float) -> None:
    """Refuse a λ that is negative, NaN or infinite (NaN passes ``< 0`` and poisons every score)."""
    if not (math.isfinite(lambda_reg) and lambda_reg >= 0):
        raise ConfigError(
            f"lambda_reg={lambda_reg}; expected a finite value ≥ 0 (e.g. 1e-2) or lambda_reg=auto."
        )


@dataclass(frozen=True)
class Factorization:
    """Eigendecomposition XᵀX = V diag(e) Vᵀ; (XᵀX + λI)⁻¹ = V diag(1/(e+λ)) Vᵀ for any λ.
    ``rank_bound``: how many outer products XᵀX sums (``scoring.rank_bound``: the train rows, or
    a causal LM Fisher's tokens), which ``auto`` divides its trace by."""

    eigenvalues: np.ndarray
    eigenvectors: np.ndarray
    rank_bound: int

    @classmethod
    def of(
        cls, xtx: np.ndarray, rank_bound: int, device: torch.device | str = "cpu", context: str = ""
    ) -> Factorization:
        """Raises NonFiniteError for an XᵀX with NaN/inf entries (``context`` names it)."""
        if not np.isfinite(xtx).all():
            raise NonFiniteError(_damaged(context))
        t = torch.as_tensor(xtx, dtype=torch.float64, device=device)
        evals, evecs = torch.linalg.eigh((t + t.T) / 2)
        return cls(evals.cpu().numpy(), evecs.cpu().numpy(), rank_bound)

    @property
    def proj_dim(self) -> int:
        return int(self.eigenvalues.shape[0])

    def resolve_lambda(self, lambda_reg: LambdaReg, context: str = "") -> float:
        """The λ to use: ``lambda_reg``, or the ``auto`` rule on these eigenvalues
        (NonFiniteError for NaN/inf ones, which ``auto_lambda`` would turn into λ = 1)."""
        self.check_finite(context)
        if lambda_reg == AUTO:
            return auto_lambda(self.eigenvalues, self.rank_bound)
        if lambda_reg == BEST:  # needs the store's record: scoring.resolve_best
            raise ConfigError(
                "lambda_reg=best must be resolved against a store's recorded best λ first "
                "(trak_dist.scoring.resolve_best); this is a bug in the caller."
            )
        return float(lambda_reg)

    def check_finite(self, context: str = "") -> None:
        """Raises NonFiniteError if the eigenvalues hold NaN/inf (a damaged stored factor)."""
        if not np.isfinite(self.eigenvalues).all():
            raise NonFiniteError(_damaged(context))

    def kinv(self, lambda_reg: float, scaling: str = "mean_abs", context: str = "") -> np.ndarray:
        """``[p, p]`` float64 (XᵀX + λI)⁻¹, divided by its mean |entry| for ``mean_abs`` (as
        traker 0.3.2; ``none`` and ``per_target``: unscaled, the latter's scaling is
        :meth:`per_target`'s); IllConditionedError when singular to float64 precision."""
        check_lambda(lambda_reg)
        if scaling not in KINV_SCALINGS or scaling == AUTO:
            raise ConfigError(
                f"kinv_scaling={scaling!r}; expected one of {KINV_SCALINGS[1:]} (resolve auto "
                "with resolve_kinv_scaling first)."
            )
        self.check_conditioning(lambda_reg, context)
        v = self.eigenvectors
        kinv = (v / (self.eigenvalues + lambda_reg)) @ v.T
        if scaling == "mean_abs":
            kinv = kinv / np.abs(kinv).mean()
        return kinv

    def per_target(self, device: torch.device | str) -> Callable[[torch.Tensor], torch.Tensor]:
        """The scaling of ``kinv_scaling=per_target``: ``y`` ``[m, p]`` float64 (rows K⁻¹ x_t)
        with each row divided by √(yᵀ XᵀX y), the norm of the target's column of this
        checkpoint's scores X y (a row with norm 0 stays 0). The factor goes to ``device`` once,
        here, not per target block or per query."""
        v = torch.as_tensor(self.eigenvectors, dtype=torch.float64, device=device)
        e = torch.as_tensor(np.clip(self.eigenvalues, 0, None), dtype=torch.float64, device=device)

        def scale(y: torch.Tensor) -> torch.Tensor:
            norm = ((y @ v) ** 2 @ e).sqrt()
            return y / torch.where(norm > 0, norm, torch.ones_like(norm))[:, None]

        return scale

    def check_conditioning(self, lambda_reg: float, context: str = "") -> float:
        """The condition number of XᵀX + λI; raises when it is numerically singular."""
        self.check_finite(context)
        e = self.eigenvalues + lambda_reg
        top = float(e.max())
        low = float(e.min())
        p, n = self.proj_dim, self.rank_bound
        tol = max(top, np.finfo(np.float64).tiny) * p * np.finfo(np.float64).eps
        where = f" ({context})" if context else ""
        if top <= 0 or low <= tol:
            # the rows bound the rank only below p; a causal LM Fisher's bound (its tokens) is ≥ p
            rank_hint = (
                f" With n={n} train examples and proj_dim={p}, XᵀX has rank ≤ {n} < proj_dim."
                if n < p
                else ""
            )
            raise IllConditionedError(
                f"XᵀX + λI is singular{where}: smallest eigenvalue {low:.3g}, largest {top:.3g}, "
                f"λ={lambda_reg:g}.{rank_hint} Scores would be noise. Use lambda_reg=auto (here "
                f"λ={auto_lambda(self.eigenvalues, n):.3g}, scaled to this spectrum) or a "
                "larger lambda_reg."
            )
        cond = top / low
        if cond > WARN_CONDITION:
            logger.warning(
                "XᵀX + λI is ill-conditioned%s: condition number %.3g (λ=%g); scores lose about "
                "%d digits. A larger lambda_reg stabilises them.",
                where,
                cond,
                lambda_reg,
                int(np.log10(cond)),
            )
        return cond
