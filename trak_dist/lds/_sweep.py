"""A λ sweep measured by LDS: score each λ from the stored features (docs/design.md, invariant
10: a λ costs a ``[p, p]`` inverse from the stored factorisation and one pass over X, never a
gradient), then record the best λ per proj_dim for ``lambda_reg=best`` (``EvalSet.record_best``)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

import numpy as np

from trak_dist._config_services import GRID
from trak_dist.config import JobConfig
from trak_dist.errors import StoreStateError
from trak_dist.lds._output import best
from trak_dist.lds._scores import VariantLDS
from trak_dist.scoring import AUTO, LambdaReg, compute_scores, ensure_factor, resolve_kinv_scaling
from trak_dist.store import FeatureStore, store_lock, variant_name

# the grid, as powers of ten times the auto λ: 1e-3 … 10 in half decades. The best λ measured
# on six benchmarks lies between ~0.25× and ~3.3× auto (benchmarks/RESULTS.md, λ on
# transformers): covered with a decade or more to spare on either side
GRID_EXPONENTS = tuple(k / 2 for k in range(-6, 3))


def _round(x: float, digits: int = 2) -> float:
    """``x`` to ``digits`` significant digits (readable variant names, e.g. p512_lambda0.0032)."""
    return float(f"{x:.{digits - 1}e}") if x > 0 else 0.0


def model_ids(store: FeatureStore, exp: str, proj_dim: int, kinv_scaling: str) -> list[int]:
    """The checkpoints a sweep averages over: those of the experiment's scores already at
    ``proj_dim`` (λ are compared on the same checkpoints), else every stored one."""
    for name in store.score_variants(exp):
        attrs = store.score_set(exp, name).attrs  # type: ignore[union-attr]
        if attrs.get("proj_dim") == proj_dim and attrs.get("kinv_scaling") == kinv_scaling:
            return [int(c) for c in attrs.get("model_ids", [])]
    return store.checkpoint_ids()


def expand_lambdas(
    store: FeatureStore, ids: Sequence[int], proj_dim: int, entries: Sequence[Any]
) -> list[LambdaReg]:
    """``eval.lambdas`` as the λ to score: ``grid`` becomes ``auto`` and the mean over
    checkpoints of the auto λ times 10^k for k in ``GRID_EXPONENTS`` (2 significant digits)."""
    out: list[LambdaReg] = []
    for entry in entries:
        if entry == GRID:
            auto = float(
                np.mean([ensure_factor(store, c, proj_dim).resolve_lambda(AUTO) for c in ids])
            )
            new: list[LambdaReg] = [_round(auto * 10**k) for k in GRID_EXPONENTS]
            new.append(AUTO)
        else:
            new = [entry]
        out += [lam for lam in new if lam not in out]
    return out


def score_lambdas(cfg: JobConfig, device: str = "cpu") -> list[str]:
    """Score ``cfg.eval.lambdas`` at ``cfg.proj_dim`` where the experiment lacks them; returns
    the variants scored now (those already complete are kept as they are)."""
    if not cfg.eval.lambdas:
        return []
    store = FeatureStore.open(cfg.store.path, options=cfg.store.options)
    exp, p = cfg.scoring.exp_name, cfg.proj_dim
    scaling = resolve_kinv_scaling(cfg.scoring.kinv_scaling, store.spec)
    if exp not in store.experiments():
        raise StoreStateError(
            f"the store at {cfg.store.path} has no experiment {exp!r} (it has "
            f"{store.experiments()}): run `trak-dist` with the same settings first, then "
            "`trak-dist eval`."
        )
    ids = model_ids(store, exp, p, scaling)
    # factorising writes the store's shared factor arrays: serialised like the pipeline's
    with store_lock(cfg.store.path, options=cfg.store.options):
        for c in ids:
            ensure_factor(store, c, p, device)
    done = set(store.score_variants(exp))
    scored = []
    for lam in expand_lambdas(store, ids, p, cfg.eval.lambdas):
        name = variant_name(p, lam, scaling)
        if name in done:
            continue
        # the job's scoring settings, whole: its memory budget, what is written, block rows
        compute_scores(store, cfg.scoring, ids, p, lam, device)
        scored.append(name)
    return scored


def best_by_proj_dim(rows: Sequence[VariantLDS], kinv_scaling: str) -> dict[int, VariantLDS]:
    """The highest-LDS variant per proj_dim among those with ``kinv_scaling``."""
    out = {}
    for p in sorted({r.proj_dim for r in rows}):
        top = best([r for r in rows if r.proj_dim == p and r.kinv_scaling == kinv_scaling])
        if top is not None:
            out[p] = top
    return out


def record_best_lambdas(cfg: JobConfig, rows: Sequence[VariantLDS]) -> dict[int, dict[str, Any]]:
    """Record the best λ per proj_dim of ``rows`` (measured against ``eval/<exp>``) in the
    store; returns the records by proj_dim."""
    exp = cfg.scoring.exp_name
    store = FeatureStore.open(cfg.store.path, options=cfg.store.options)
    scaling = resolve_kinv_scaling(cfg.scoring.kinv_scaling, store.spec)
    ev = store.eval_set(exp)
    if ev is None:
        return {}
    settings = ev.settings
    when = datetime.now(timezone.utc).isoformat(timespec="seconds")
    records = {}
    with store_lock(cfg.store.path, options=cfg.store.options):
        for p, top in best_by_proj_dim(rows, scaling).items():
            peers = [r for r in rows if r.proj_dim == p and r.kinv_scaling == scaling]
            rec = {
                "lambda_reg": top.lambda_reg,
                "lambdas": [float(x) for x in top.lambdas],
                "variant": top.variant,
                "kinv_scaling": scaling,
                "model_ids": top.model_ids,
                **top.result.to_json(),
                "candidates": {
                    str(r.lambda_reg): round(r.result.lds, 4)
                    for r in peers
                    if math.isfinite(r.result.lds)
                },
                "eval": {k: settings.get(k) for k in ("recipe", "alpha", "seed", "num_models")},
                "measured_at": when,
            }
            ev.record_best(p, rec)
            records[p] = rec
    return records
