"""Offline scoring for ``benchmarks.lm_pipeline``: TRAK's formula with any p × p curvature K,
over a grid of λ, and the LDS of a score matrix against the cached subset models."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from trak_dist.lds import spearman

# λ = c · tr(K) / min(rank, p): the auto rule's form, c on a quarter-decade grid
GRID = 10.0 ** np.arange(-3, 2.01, 0.25)


@dataclass(frozen=True)
class Curv:
    """One checkpoint's rows ``X`` ``[n, p]``, targets ``T`` ``[m, p]`` and curvature ``K``
    ``[p, p]`` with its rank bound (n for a Gram of n rows, n·T for token-level)."""

    X: np.ndarray
    T: np.ndarray
    K: np.ndarray
    rank: int


def _scores_over_grid(
    cv: Curv, p: int, grid: np.ndarray, scaling: str = "mean_abs"
) -> list[np.ndarray]:
    """``[n, m]`` per λ of the grid: X K_λ⁻¹ Tᵀ / mean|K_λ⁻¹| (trak_dist's ``mean_abs``
    rescaling, which sets the checkpoints' relative weight) or, ``per_target``, each target's
    column divided by √(y_tᵀ K y_t), y_t = K_λ⁻¹ t (``Factorization.per_target``)."""
    # float32 LAPACK: ~2× faster, and λ ≥ 10⁻³ · the mean eigenvalue hides its rounding
    e, v = (z.astype(np.float64) for z in np.linalg.eigh(cv.K[:p, :p].astype(np.float32)))
    e = np.clip(e, 0, None)
    unit = e.sum() / min(cv.rank, p)
    a, b = cv.X[:, :p] @ v, cv.T[:, :p] @ v
    # mean|K⁻¹| from 64 of its rows (a p³ product per λ would dominate the whole benchmark)
    rows = np.random.default_rng(0).choice(p, min(p, 64), replace=False)
    vs = v[rows]
    out = []
    for c in grid:
        w = 1.0 / (e + c * unit)
        if scaling == "per_target":
            y = b * w  # the targets' K_λ⁻¹ t in the eigenbasis
            norm = np.sqrt(((y * y) * e).sum(1))
            out.append((a * w) @ b.T / np.where(norm > 0, norm, 1.0)[None, :])
        else:
            kinv_abs = np.abs((vs * w) @ v.T).mean()
            out.append((a * w) @ b.T / kinv_abs)
    return out


def lds(scores: np.ndarray, masks: np.ndarray, outputs: np.ndarray) -> float:
    """Mean over targets of Spearman(Σ_{i in subset} S[i, t], output of the subset model)."""
    return float(np.nanmean(spearman(masks.astype(np.float64) @ scores, outputs)))


def lds_metric(masks: np.ndarray, outputs: np.ndarray) -> Callable[[np.ndarray], float]:
    """``lds`` against these subset models, as ``curve``'s ``metric``."""
    return lambda scores: lds(scores, masks, outputs)


def curve(
    ckpts: list[Curv],
    p: int,
    metric: Callable[[np.ndarray], float],
    grid: np.ndarray = GRID,
    scaling: str = "mean_abs",
) -> tuple[np.ndarray, np.ndarray]:
    """``(metric of the last checkpoint's scores, of the checkpoints' mean)``, each
    ``[len(grid)]``; ``metric`` maps ``[n, m]`` scores to a number (the LDS, an MRR);
    ``scaling`` as ``scoring.kinv_scaling`` (``mean_abs`` or ``per_target``)."""
    per = [_scores_over_grid(cv, p, grid, scaling) for cv in ckpts]
    last = np.array([metric(s) for s in per[-1]])
    mean = np.array([metric(np.mean([pc[i] for pc in per], 0)) for i in range(len(grid))])
    return last, mean


def at(curve_: np.ndarray, c: float, grid: np.ndarray = GRID) -> float:
    """The curve at constant ``c`` (interpolated in log c)."""
    return float(np.interp(np.log(c), np.log(grid), curve_))


def cells(
    last: np.ndarray, mean: np.ndarray, c: float = 1.25, grid: np.ndarray = GRID
) -> list[str]:
    """A table's ``last: λ auto``, ``mean: λ auto`` and ``mean: best (c)`` cells of ``curve``'s
    two curves, auto being the constant ``c``."""
    best = int(np.argmax(mean))
    return [
        f"{at(last, c, grid):.3f}",
        f"{at(mean, c, grid):.3f}",
        f"{mean[best]:.3f} ({grid[best]:.3g})",
    ]
