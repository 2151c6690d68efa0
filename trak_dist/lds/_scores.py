"""The LDS of the score sets in a store, against its stored subset models."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from trak_dist.errors import StoreStateError
from trak_dist.lds._metric import LDSResult, lds, predictions
from trak_dist.store import FeatureStore, ScoreSet


@dataclass(frozen=True)
class VariantLDS:
    """One score variant's LDS, with what defines the variant."""

    variant: str
    proj_dim: int
    lambda_reg: float | str
    lambdas: list[float]
    result: LDSResult
    kinv_scaling: str = "mean_abs"
    model_ids: list[int] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "variant": self.variant,
            "proj_dim": self.proj_dim,
            "lambda_reg": self.lambda_reg,
            "lambdas": [float(f"{x:.4g}") for x in self.lambdas],
            **self.result.to_json(),
        }


def score_predictions(sset: ScoreSet, masks: np.ndarray, block: int = 4096) -> np.ndarray:
    """``[M, m]`` Σ_{i ∈ S_j} τ_it, reading S ``[n, m]`` ``block`` train rows at a time (memory:
    one block of S and the ``[M, m]`` result)."""
    n, m = sset.shape
    if masks.shape[1] != n:
        raise StoreStateError(
            f"the subset masks cover {masks.shape[1]} train examples; the scores {n}."
        )
    out = np.zeros((masks.shape[0], m))
    for r0 in range(0, n, block):
        r1 = min(n, r0 + block)
        out += predictions(masks[:, r0:r1], sset.read_rows(r0, r1))
    return out


def store_lds(
    store: FeatureStore,
    exp: str,
    variants: list[str] | None = None,
    num_models: int | None = None,
    bootstrap: int = 1000,
    seed: int = 0,
) -> list[VariantLDS]:
    """The LDS of each completed score set of ``exp`` (or ``variants``) from the first
    ``num_models`` done subset models of ``eval/<exp>`` (StoreStateError: fewer than 3)."""
    ev = store.eval_set(exp)
    if ev is None:
        raise StoreStateError(
            f"the store at {store.where} holds no subset models for {exp!r}; run "
            "`trak-dist eval` (or trak_dist.evaluate) first."
        )
    masks, margins = ev.finished(num_models)
    if masks.shape[0] < 3:
        raise StoreStateError(
            f"only {masks.shape[0]} subset models of {exp!r} are stored; the LDS needs at least "
            "3. Rerun `trak-dist eval` to train the rest."
        )
    out = []
    for name in store.score_variants(exp) if variants is None else variants:
        sset = store.score_set(exp, name)
        if sset is None or not sset.complete:
            raise StoreStateError(f"no completed scores {exp}/{name} in {store.where}.")
        attrs = sset.attrs
        pred = score_predictions(sset, masks)
        lam = attrs.get("lambda_reg", float("nan"))
        out.append(
            VariantLDS(
                variant=name,
                proj_dim=int(attrs.get("proj_dim", 0)),
                lambda_reg=lam if isinstance(lam, str) else float(lam),
                lambdas=[float(x) for x in attrs.get("lambdas", [])],
                result=lds(pred, margins.astype(np.float64), bootstrap, seed=seed),
                kinv_scaling=sset.kinv_scaling,
                model_ids=[int(c) for c in attrs.get("model_ids", [])],
            )
        )
    return out
