"""The linear datamodeling score (LDS; Park et al., TRAK, 2023, §2.2) and its bootstrap interval.

Target t's prediction for subset model j is g_jt = Σ_{i ∈ S_j} τ_it; its LDS is the Spearman
correlation over j of g_jt and the measured margin f_jt. A score set's LDS is the target mean."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class LDSResult:
    """Mean Spearman over targets and a percentile bootstrap interval of it.

    Attributes:
        lds: mean over targets with a defined correlation.
        low, high: the interval at ``level`` (resampling models and targets together).
        per_target: ``[m]`` Spearman per target (NaN where a side is constant over models).
        models, targets: subset models used (M), targets with a defined correlation.
    """

    lds: float
    low: float
    high: float
    per_target: np.ndarray
    models: int
    targets: int
    level: float

    def to_json(self) -> dict[str, float | int]:
        return {
            "lds": round(self.lds, 4),
            "low": round(self.low, 4),
            "high": round(self.high, 4),
            "level": self.level,
            "models": self.models,
            "targets": self.targets,
        }

    def __str__(self) -> str:
        return (
            f"{self.lds:.3f} [{self.low:.3f}, {self.high:.3f}] ({100 * self.level:.0f} % "
            f"interval, {self.models} models × {self.targets} targets)"
        )


def predictions(masks: np.ndarray, scores: np.ndarray) -> np.ndarray:
    """``[M, m]`` predicted outputs Σ_{i ∈ S_j} τ_it from ``masks`` ``[M, n]`` (bool) and one
    block of ``scores`` ``[n, m]`` (sum the results of row blocks for the whole S)."""
    return masks.astype(np.float64) @ scores.astype(np.float64)


def spearman(pred: np.ndarray, actual: np.ndarray) -> np.ndarray:
    """``[m]`` Spearman correlation of each column of ``pred`` and ``actual`` (``[M, m]``),
    ties ranked by their average; NaN where a column is constant."""
    from scipy.stats import rankdata  # heavy import: only when measuring

    rp, ra = rankdata(pred, axis=0), rankdata(actual, axis=0)
    rp -= rp.mean(0)
    ra -= ra.mean(0)
    denom = np.sqrt((rp * rp).sum(0) * (ra * ra).sum(0))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(denom > 0, (rp * ra).sum(0) / np.where(denom > 0, denom, 1), np.nan)


def _resampled_ranks(order: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Average ranks ``[M, m]`` that each original row would get in a resample holding row j
    ``weights[j]`` times, from ``order`` = ``argsort(values, axis=0)`` (ties among the original
    values are broken by that order; the point estimate ranks them exactly)."""
    w = weights[order]
    avg = np.cumsum(w, axis=0) - (w - 1) / 2
    ranks = np.empty_like(avg)
    np.put_along_axis(ranks, order, avg, axis=0)
    return ranks


def _weighted_spearman(op: np.ndarray, oa: np.ndarray, weights: np.ndarray) -> np.ndarray:
    rp, ra = _resampled_ranks(op, weights), _resampled_ranks(oa, weights)
    w = weights[:, None] / weights.sum()
    rp -= (w * rp).sum(0)
    ra -= (w * ra).sum(0)
    denom = np.sqrt((w * rp * rp).sum(0) * (w * ra * ra).sum(0))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(denom > 0, (w * rp * ra).sum(0) / np.where(denom > 0, denom, 1), np.nan)


def lds(
    pred: np.ndarray, actual: np.ndarray, bootstrap: int = 1000, level: float = 0.95, seed: int = 0
) -> LDSResult:
    """The LDS of predictions ``pred`` against measured outputs ``actual``, both ``[M, m]``; the
    interval resamples models and targets (``bootstrap`` times, from ``seed``) as
    multiplicities, so each draw costs a cumulative sum instead of a sort."""
    if pred.shape != actual.shape or pred.ndim != 2:
        raise ValueError(f"pred {pred.shape} and actual {actual.shape} must both be [M, m].")
    rho = spearman(pred, actual)
    ok = ~np.isnan(rho)
    mean = float(rho[ok].mean()) if ok.any() else float("nan")
    low = high = mean
    n_models, n_targets = pred.shape[0], int(ok.sum())
    if bootstrap > 0 and n_targets > 1 and n_models > 2:
        rng = np.random.default_rng(seed)
        op, oa = np.argsort(pred[:, ok], axis=0), np.argsort(actual[:, ok], axis=0)
        draws = np.empty(bootstrap)
        for b in range(bootstrap):
            wm = np.bincount(rng.integers(0, n_models, n_models), minlength=n_models)
            wt = np.bincount(rng.integers(0, n_targets, n_targets), minlength=n_targets)
            r = _weighted_spearman(op, oa, wm.astype(np.float64))
            keep = ~np.isnan(r) & (wt > 0)
            draws[b] = (wt[keep] * r[keep]).sum() / wt[keep].sum() if keep.any() else np.nan
        low, high = (float(v) for v in np.nanquantile(draws, [(1 - level) / 2, (1 + level) / 2]))
    return LDSResult(mean, low, high, rho, n_models, n_targets, level)
