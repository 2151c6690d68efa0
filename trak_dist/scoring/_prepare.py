"""``prepare_scoring``: everything a block-wise scoring needs before its blocks run: checks, λ
per checkpoint, Y_c = X_tc K_c⁻¹ once per checkpoint, the plan, the unfinished score set (an
earlier run's, when the plan and the features are the same) and the blocks it still lacks."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import torch

from trak_dist.errors import StoreStateError, TrakDistError
from trak_dist.scoring._ensure import ensure_factor
from trak_dist.scoring._factor import Factorization, resolve_kinv_scaling
from trak_dist.scoring._job import ScoreJob
from trak_dist.scoring._lambda import AUTO, auto_rule, parse_lambda, resolve_best
from trak_dist.scoring._plan import BlockTask, ScorePlan
from trak_dist.scoring._settings import ScoreRequest
from trak_dist.store import FeatureStore, ScoreSet, scoring_lease, variant_name


def _check_inputs(store: FeatureStore, exp: str, ids: list[int], p: int) -> None:
    spec = store.spec
    if p > spec.proj_dim:
        raise StoreStateError(
            f"proj_dim={p} exceeds the store's featurised proj_dim={spec.proj_dim}; "
            "featurise at the largest proj_dim of a sweep."
        )
    train_sets = [store.train_rows(c) for c in ids]
    target_sets = [store.target_rows(exp, c) for c in ids]
    for c, rs in zip(ids, train_sets, strict=True):
        if not rs.is_complete():
            raise StoreStateError(f"model_id={c}: train features are incomplete; featurise first.")
    for c, ts in zip(ids, target_sets, strict=True):
        if not ts.is_complete():
            raise StoreStateError(f"model_id={c}: targets of {exp!r} are not all featurised.")
    store.check_same_items(list(zip(ids, train_sets, strict=True)), "train")
    store.check_same_items(list(zip(ids, target_sets, strict=True)), f"target ({exp!r})")


def prepare_scoring(
    store: FeatureStore, request: ScoreRequest, device: torch.device | str = "cpu"
) -> ScoreJob:
    """Everything a scoring needs before its blocks run (see the module docstring); a set
    left unfinished by an earlier run of the same plan is resumed, its committed blocks kept."""
    s, proj_dim, exp = request.scoring, request.proj_dim, request.scoring.exp_name
    topk, write_scores = s.topk, s.write_scores
    spec = store.spec
    kinv_scaling = resolve_kinv_scaling(s.kinv_scaling, spec)
    p = spec.proj_dim if proj_dim is None else proj_dim
    n, m, ids = spec.train_size, store.num_targets(exp), list(request.model_ids)
    lambda_reg = parse_lambda(request.lambda_reg)  # a NaN/inf λ is refused before any work
    _check_inputs(store, exp, ids, p)
    # best: the λ trak-dist eval recorded (a number or auto), or an error naming what to run
    lambda_reg, best_rule = resolve_best(store, exp, p, lambda_reg, kinv_scaling)
    # every checkpoint's λ first (auto: from its spectrum; a non-finite XᵀX or factor is a
    # NonFiniteError, not auto's fallback λ = 1). Factors are re-read below: one p² factor in
    # memory at a time.
    factors = [ensure_factor(store, c, p, device) for c in ids]
    lambdas = [
        f.resolve_lambda(lambda_reg, f"model_id={c}") for c, f in zip(ids, factors, strict=True)
    ]
    spectra = [
        hashlib.sha256(np.ascontiguousarray(f.eigenvalues).tobytes()).hexdigest() for f in factors
    ]
    del factors
    plan = ScorePlan.of(n, m, p, len(ids), s, spec.chunk_rows)
    name = variant_name(p, lambda_reg, kinv_scaling)
    attrs = {
        "proj_dim": p,
        "lambda_reg": lambda_reg,
        "lambda_rule": "; ".join(
            r for r in (best_rule, auto_rule() if lambda_reg == AUTO else "fixed") if r
        ),
        "kinv_scaling": kinv_scaling,
        "model_ids": ids,
        "lambdas": lambdas,
        "write_scores": plan.write_scores,
        "write_scores_asked": write_scores,
        "super_block": plan.super_block,
        "block_rows": plan.block_rows,
        "n": n,
        "m": m,
        "topk": topk,
    }
    # the plan and what the features were (XᵀX's spectrum) name the unfinished set: a rerun
    # resumes only blocks computed from the same features with the same grid
    key = hashlib.sha256(
        json.dumps([attrs, spectra, vars(plan)], sort_keys=True, default=str).encode()
    ).hexdigest()[:16]
    grid = (len(plan.row_ranges), len(plan.super_blocks), plan.super_block)
    chunks = (min(n, spec.chunk_rows), plan.target_block)
    # held until publish or release: resume (or removal of another plan's set) and Y are
    # never done under another scoring of the variant
    lease = scoring_lease(store.where, exp, name, store.options)
    try:
        sset, resumed = store.resume_scores(exp, name, key, grid, chunks, plan.full, attrs)
        try:
            _write_y(store, exp, sset, ids, lambdas, p, kinv_scaling, plan, device)
        except (OSError, TrakDistError):
            sset.discard()  # e.g. a full disk: the previous scores stay, the space is freed
            raise
    except BaseException:
        if lease is not None:
            lease.release()
        raise
    done = sset.parts.done_mask()
    pending = [
        BlockTask(store.where, sset.group.path, r, b, tuple(ids), plan)
        for b in range(len(plan.super_blocks))
        for r in range(len(plan.row_ranges))
        if not done[r, b]
    ]
    return ScoreJob(store, exp, name, plan, sset, pending, resumed, lambdas, lease=lease)


def _write_y(
    store: FeatureStore,
    exp: str,
    sset: ScoreSet,
    ids: list[int],
    lambdas: list[float],
    p: int,
    kinv_scaling: str,
    plan: ScorePlan,
    device: torch.device | str,
) -> None:
    """Y_c = X_tc K_c⁻¹ ``[m, p]`` float32 once per checkpoint (kept by a resumed set)."""
    m, tb = plan.m, plan.target_block
    for c, lam in zip(ids, lambdas, strict=True):
        if sset.y_done(c):
            continue
        factor: Factorization = ensure_factor(store, c, p, device)
        kinv = torch.as_tensor(factor.kinv(lam, kinv_scaling, f"model_id={c}"), device=device)
        ts = store.target_rows(exp, c)
        scale = factor.per_target(device) if kinv_scaling == "per_target" else None
        sset.create_y(c, m, p, tb)
        for t0 in range(0, m, tb):
            xt = torch.as_tensor(ts.read(t0, min(m, t0 + tb), p), device=device)
            y = xt.double() @ kinv
            sset.write_y(c, t0, (y if scale is None else scale(y)).float().cpu().numpy())
        sset.commit_y(c)
        del kinv
