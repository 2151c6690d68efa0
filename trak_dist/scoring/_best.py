"""``lambda_reg=best``: the λ ``trak-dist eval`` recorded as best by LDS for this store,
experiment and proj_dim (``store._best``). Never a silent fallback: no record is an error
that says what to run."""

from __future__ import annotations

from typing import Any

from trak_dist.errors import StoreStateError
from trak_dist.scoring._lambda import BEST, LambdaReg, parse_lambda
from trak_dist.store import FeatureStore, recorded_best


def best_record(
    store: FeatureStore, exp: str, proj_dim: int, kinv_scaling: str = "mean_abs"
) -> dict[str, Any]:
    """The record of the best λ measured for ``exp`` at ``proj_dim`` (StoreStateError: none
    recorded, or recorded for another ``kinv_scaling``)."""
    records = recorded_best(store.eval_set(exp))
    rec = records.get(int(proj_dim))
    if rec is None:
        at = ", ".join(str(q) for q in sorted(records))
        others = f" (it has one for proj_dim {at})" if records else ""
        raise StoreStateError(
            f"lambda_reg=best: no best λ is recorded for experiment {exp!r} at "
            f"proj_dim={proj_dim} in {store.where}{others}. Measure it first: `trak-dist eval "
            f"proj_dim={proj_dim} scoring.exp_name={exp} 'eval.lambdas=[grid]'` (or a list of "
            "λ) scores each λ from the stored features and records the best; or give "
            "lambda_reg a number or auto."
        )
    if rec.get("kinv_scaling", "mean_abs") != kinv_scaling:
        raise StoreStateError(
            f"lambda_reg=best: the best λ for {exp!r} at proj_dim={proj_dim} was measured with "
            f"scoring.kinv_scaling={rec.get('kinv_scaling')!r}, not {kinv_scaling!r}. Use that "
            "scaling, or run `trak-dist eval` with this one to measure its best λ."
        )
    return rec


def resolve_best(
    store: FeatureStore,
    exp: str,
    proj_dim: int,
    lambda_reg: LambdaReg,
    kinv_scaling: str = "mean_abs",
) -> tuple[LambdaReg, str | None]:
    """``lambda_reg`` as ``compute_scores`` uses it: unchanged unless ``best``, which becomes
    the recorded λ (a number or ``auto``); also the rule to record next to the scores (None:
    not from a record)."""
    if parse_lambda(lambda_reg) != BEST:
        return parse_lambda(lambda_reg), None
    rec = best_record(store, exp, proj_dim, kinv_scaling)
    rule = (
        f"best by LDS ({rec['lds']:.3f}) among {len(rec.get('candidates', {}))} λ measured by "
        f"trak-dist eval on eval/{exp} ({rec['models']} subset models, {rec['measured_at']})"
    )
    return parse_lambda(rec["lambda_reg"]), rule
