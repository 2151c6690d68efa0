"""Block-wise scores from the store, memory independent of n and m (docs/design.md, invariant 5).

Φ_c X_tcᵀ = X_c K_c⁻¹ X_tcᵀ = X_c Y_cᵀ with Y_c = X_tc K_c⁻¹ stored once per checkpoint; each
(train block × target block) of S is Σ_c X_c[b] Y_c[t]ᵀ / C times its rows' mean Q. Φ is never
formed and new targets cost only their Y. Peak memory: K⁻¹ (p²), C·T·p of Y (T shrinks to
keep it under ``memory_bytes``), a train block and a score block."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from tqdm.auto import tqdm

from trak_dist.errors import NonFiniteError, StoreStateError
from trak_dist.scoring._best import resolve_best
from trak_dist.scoring._factor import Factorization, gram
from trak_dist.scoring._lambda import AUTO, LambdaReg, auto_rule, parse_lambda
from trak_dist.store import FeatureStore, RowSet, ScoreSet, variant_name


def xtx_from_rows(
    rows: RowSet, start: int, end: int, block: int = 8192, device: torch.device | str = "cpu"
) -> np.ndarray:
    """XᵀX (float64) of stored rows ``[start, end)``, read ``block`` rows at a time."""
    out = np.zeros((rows.proj_dim, rows.proj_dim), dtype=np.float64)
    for r0 in range(start, end, block):
        out += gram(rows.read(r0, min(end, r0 + block)), device)
    return out


def ensure_factor(
    store: FeatureStore, model_id: int, proj_dim: int, device: torch.device | str = "cpu"
) -> Factorization:
    """The factorisation of XᵀX[:p, :p] for ``model_id``: read from the store or computed once."""
    n = store.spec.train_size
    cached = store.read_factor(model_id, proj_dim)
    if cached is not None:
        return Factorization(cached[0], cached[1], n)
    xtx = store.read_xtx(model_id)
    if xtx is None:
        raise StoreStateError(
            f"model_id={model_id} has no XᵀX in {store.where}: its train features are not "
            "finalised. Run finalize_features (or the pipeline's featurise phase) first."
        )
    factor = Factorization.of(xtx[:proj_dim, :proj_dim], n, device, f"model_id={model_id}")
    store.write_factor(model_id, proj_dim, factor.eigenvalues, factor.eigenvectors)
    return factor


def _merge_topk(
    best: tuple[torch.Tensor, torch.Tensor] | None, block: torch.Tensor, first_row: int, k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    vals, idx = torch.topk(block, min(k, block.shape[0]), dim=0)
    idx = idx + first_row
    if best is not None:
        # blocks may be shorter than k (train_block < topk): keep what there is so far
        both = torch.cat([best[0], vals])
        vals, pos = torch.topk(both, min(k, both.shape[0]), dim=0)
        idx = torch.gather(torch.cat([best[1], idx]), 0, pos)
    return vals, idx


def _refuse_non_finite(block: torch.Tensor, r0: int, t0: int, exp: str, variant: str) -> None:
    """The last guard of "no NaN score with exit code 0": the rows, Q and XᵀX read are checked
    finite (non-finite rows are never committed; reads are checked, store/_integrity.py), so a
    non-finite score can only be float32 overflow of X·Y."""
    bad = ~torch.isfinite(block)
    if bool(bad.any()):
        rows, cols = bad.nonzero(as_tuple=True)
        raise NonFiniteError(
            f"scores {exp}/{variant} are non-finite at {int(bad.sum())} entries, e.g. train row "
            f"{r0 + int(rows[0])} × target {t0 + int(cols[0])}, though the features read were "
            "finite: they overflow float32. Use a larger lambda_reg (or lambda_reg=auto); the "
            "previous scores are kept."
        )


def compute_scores(
    store: FeatureStore,
    exp: str,
    model_ids: Sequence[int],
    proj_dim: int | None = None,
    lambda_reg: LambdaReg = AUTO,
    kinv_scaling: str = "mean_abs",
    topk: int = 10,
    train_block: int = 4096,
    target_block: int = 1024,
    memory_bytes: int = 1 << 30,
    device: torch.device | str = "cpu",
    progress: bool = False,
) -> ScoreSet:
    """Score every target of ``exp`` against every train example, averaged over ``model_ids``
    (``lambda_reg`` a number, ``"auto"``, or ``"best"``: the λ ``trak-dist eval`` recorded for
    ``exp`` at this proj_dim; the λ used per checkpoint is recorded in ``lambdas``); the
    completed ScoreSet replaces the variant's previous scores only once complete."""
    spec = store.spec
    p = spec.proj_dim if proj_dim is None else proj_dim
    n, m, ids = spec.train_size, store.num_targets(exp), list(model_ids)
    lambda_reg = parse_lambda(lambda_reg)  # a NaN/inf λ is refused before any work
    if p > spec.proj_dim:
        raise StoreStateError(
            f"proj_dim={p} exceeds the store's featurised proj_dim={spec.proj_dim}; "
            "featurise at the largest proj_dim of a sweep."
        )
    # best: the recorded λ (a number or auto), or an error naming what to run
    lambda_reg, best_rule = resolve_best(store, exp, p, lambda_reg, kinv_scaling)
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

    # every checkpoint's λ first (auto: from its spectrum; a non-finite XᵀX or factor is a
    # NonFiniteError, not auto's fallback λ = 1). Factors are re-read below: one p² factor in
    # memory at a time.
    lambdas = [
        ensure_factor(store, c, p, device).resolve_lambda(lambda_reg, f"model_id={c}") for c in ids
    ]
    name = variant_name(p, lambda_reg, kinv_scaling)
    attrs = {
        "proj_dim": p,
        "lambda_reg": lambda_reg,
        "lambda_rule": "; ".join(
            r for r in (best_rule, auto_rule() if lambda_reg == AUTO else "fixed") if r
        ),
        "kinv_scaling": kinv_scaling,
        "model_ids": ids,
    }
    # the previous scores of this variant stay in place until the new ones are complete
    with store.create_scores(exp, name, n, m, topk, attrs) as sset:
        tb = max(1, min(target_block, memory_bytes // (4 * p * len(ids))))
        for c, lam, ts in zip(ids, lambdas, target_sets, strict=True):
            factor = ensure_factor(store, c, p, device)
            kinv = torch.as_tensor(factor.kinv(lam, kinv_scaling, f"model_id={c}"), device=device)
            sset.create_y(c, m, p, tb)
            for t0 in range(0, m, tb):
                xt = torch.as_tensor(ts.read(t0, min(m, t0 + tb), p), device=device)
                sset.write_y(c, t0, (xt.double() @ kinv).float().cpu().numpy())
            del kinv
        # in the partial set's attributes: they move into place with it (publish)
        sset.set_attrs(lambdas=lambdas)

        k = min(topk, n)
        bar = tqdm(
            total=-(-m // tb) * -(-n // train_block),
            desc=f"scores {exp}/{name}",
            disable=not progress,
            unit="block",
        )
        for t0 in range(0, m, tb):
            t1 = min(m, t0 + tb)
            yblocks = [torch.as_tensor(sset.read_y(c, t0, t1), device=device) for c in ids]
            best: tuple[torch.Tensor, torch.Tensor] | None = None
            worst: tuple[torch.Tensor, torch.Tensor] | None = None
            for r0 in range(0, n, train_block):
                r1 = min(n, r0 + train_block)
                acc = torch.zeros(r1 - r0, t1 - t0, dtype=torch.float32, device=device)
                qbar = torch.zeros(r1 - r0, dtype=torch.float32, device=device)
                for rs, yb in zip(train_sets, yblocks, strict=True):
                    x = torch.as_tensor(rs.read(r0, r1, p), device=device).float()
                    acc.addmm_(x, yb.T)
                    qbar += torch.as_tensor(rs.read_q(r0, r1), device=device)
                block = (acc / len(ids)) * (qbar / len(ids))[:, None]
                _refuse_non_finite(block, r0, t0, exp, name)
                sset.write_block(r0, t0, block.cpu().numpy())
                best = _merge_topk(best, block, r0, k)
                worst = _merge_topk(worst, -block, r0, k)
                bar.update()
            assert best is not None and worst is not None  # n ≥ 1, so the loop ran
            sset.write_topk(
                t0,
                {
                    "proponents_idx": best[1].T.cpu().numpy(),
                    "proponents_val": best[0].T.cpu().numpy(),
                    "opponents_idx": worst[1].T.cpu().numpy(),
                    "opponents_val": (-worst[0]).T.cpu().numpy(),
                },
            )
        bar.close()
    return sset.publish()
