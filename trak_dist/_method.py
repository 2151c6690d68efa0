"""What a run's features and curvature K are, for its report: the values ``auto`` resolved
to (``projection``, ``featurize.curvature``, ``scoring.kinv_scaling``), read from the store's
spec and the score set, not from the config that asked for them."""

from __future__ import annotations

from typing import Any

from trak_dist.store import FeatureSpec

SCALINGS = {  # scoring.kinv_scaling, resolved (docs/design.md, "Checkpoint weights")
    "mean_abs": "mean_abs (each K⁻¹ divided by its mean |entry|, as traker)",
    "per_target": "per_target (each checkpoint weighs the same in every target's mean)",
    "none": "none (K⁻¹ unscaled)",
}


def describe(spec: FeatureSpec) -> dict[str, Any]:
    """The report's ``method``: the projection, its sizes and storage, and what K's Gram is
    (``fisher_draws``: label draws per train example, 0 for XᵀX)."""
    fisher = spec.curvature == "fisher"
    return {
        "projection": spec.projection,
        "grad_dim": spec.grad_dim,
        "proj_dim": spec.proj_dim,
        "dtype": spec.dtype,
        "curvature": spec.curvature,
        "fisher_draws": spec.fisher_draws if fisher else 0,
    }


def method_line(method: dict[str, Any] | None) -> list[str]:
    """``method`` as one Markdown bullet (none for a summary without it)."""
    if not method:
        return []
    k = "XᵀX of the train features"
    if method["curvature"] == "fisher":
        d = method["fisher_draws"]
        k = f"GᵀG of the sampled-label Fisher ({d} label draw{'s' * (d > 1)} per train example)"
    return [
        f"- method: {method['projection']} projection of {method['grad_dim']:,} gradient "
        f"entries to p = {method['proj_dim']} ({method['dtype']}); K = {k}"
    ]


def scaling_line(kinv_scaling: str | None) -> list[str]:
    """How a variant combined its checkpoints, as one Markdown bullet (none when unknown)."""
    if kinv_scaling is None:
        return []
    return [f"- checkpoints combined: {SCALINGS.get(kinv_scaling, kinv_scaling)}"]
