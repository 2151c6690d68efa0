"""λ, the ridge term of K = XᵀX + λI: a number (traker's absolute meaning), ``"auto"`` or
``"best"`` (the λ ``trak-dist eval`` measured best by LDS on this store and recorded beside
its subset models, ``EvalSet.best_lambdas``: never a silent fallback, no record is an error
that says what to run).

``auto``: λ = AUTO_SCALE · tr(K) / min(r, p), AUTO_SCALE times the mean eigenvalue of K over
its at most min(r, p) non-zero ones, per checkpoint, whatever the gradients' units (λ = 1 for
K = 0). r (``rank_bound``) is how many outer products K estimates: the n train rows for XᵀX and
for a classifier's sampled-label Fisher (one label per row); for a causal LM's sampled-label
Fisher one per counted token, taken as ≥ p. Its rows G sum a document's tokens, but the sampled
labels' cross-token terms have mean 0, so E[GᵀG] is the token-level Fisher, whose rank is
min(tokens, p), not n (a train set of fewer than p tokens in all gets a λ too small by
tokens / p). Chosen by LDS against subset models: over six benchmarks of XᵀX (the digits MLP,
CNN and transformer, two Hugging Face BERT classifiers and a GPT-2 causal LM; p < n and p ≥ n; 1
and 3+ checkpoints; 30 curves) worst case 0.960 of each curve's best LDS, ≥ 0.95 for constants
1.12 … 1.41; over eight benchmarks of two kinds (the digits networks and five causal-LM
benchmarks with the Fisher, LDS and fact retrieval) worst 0.953, leave-one-benchmark-out 0.953
(with r = n for the Fisher too: 0.928 and 0.937; docs/decisions.md, "λ = auto"). The previous
rule, 0.007 · the largest eigenvalue, fell to 0.844 on the causal LM and no constant of it
reaches 0.95 on all six; Bergson's 0.1 · mean eigenvalue reaches 0.63 (benchmarks/RESULTS.md)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from trak_dist.errors import ConfigError, StoreStateError
from trak_dist.store import FeatureSpec, FeatureStore
from trak_dist.tasks import is_causal_lm

AUTO = "auto"
BEST = "best"
AUTO_SCALE = 1.25

LambdaReg = float | str  # a number ≥ 0, AUTO or BEST


def parse_lambda(value: Any, what: str = "lambda_reg") -> LambdaReg:
    """``value`` as a float ≥ 0, ``"auto"`` or ``"best"``; anything else (NaN, inf, negative,
    other text, a bool) is a ConfigError naming it."""
    if isinstance(value, str):
        text = value.strip().lower()
        if text in (AUTO, BEST):
            return text
        try:
            value = float(text)
        except ValueError:
            raise ConfigError(
                f"{what}={value!r}; expected 'auto' or a finite number ≥ 0 (e.g. 0.01), or 'best' "
                "(the λ `trak-dist eval` measured best)."
            ) from None
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ConfigError(
            f"{what}={value!r} ({type(value).__name__}); expected 'auto' or a finite number ≥ 0, "
            "or 'best'."
        )
    number = float(value)
    if not math.isfinite(number) or number < 0:
        raise ConfigError(
            f"{what}={number}; expected 'auto' or a finite number ≥ 0 (λ = 0 is traker's "
            "default, 'auto' scales λ to the spectrum of XᵀX, 'best' is what `trak-dist eval` "
            "measured best)."
        )
    return number


def auto_lambda(eigenvalues: np.ndarray, rank_bound: int) -> float:
    """The ``auto`` λ for K with ``eigenvalues`` ``[p]`` (tiny negative ones, eigh's rounding,
    count as 0), the sum of ``rank_bound`` outer products (:func:`rank_bound`)."""
    rank = min(int(rank_bound), int(np.size(eigenvalues)))
    if rank == 0:
        return 1.0
    lam = AUTO_SCALE * float(np.clip(eigenvalues, 0.0, None).sum()) / rank
    return lam if math.isfinite(lam) and lam > 0 else 1.0


def is_token_fisher(spec: FeatureSpec) -> bool:
    """Whether the store's K is a causal LM's sampled-label Fisher: one drawn label per token,
    which ``rank_bound`` and ``kinv_scaling=auto`` (``resolve_kinv_scaling``) both key on."""
    return spec.curvature == "fisher" and is_causal_lm(spec.model_output)


def rank_bound(spec: FeatureSpec) -> int:
    """How many outer products the store's K estimates (its rank is at most this): n train
    rows, or for a causal LM's sampled-label Fisher one per token, taken as ≥ p (module
    docstring)."""
    if is_token_fisher(spec):
        return max(spec.train_size, spec.proj_dim)
    return spec.train_size


def auto_rule() -> str:
    """The rule, as recorded next to scores computed with it."""
    return f"{AUTO_SCALE:g} × tr(K) / min(r, p)"


def best_record(
    store: FeatureStore, exp: str, proj_dim: int, kinv_scaling: str = "mean_abs"
) -> dict[str, Any]:
    """The record of the best λ measured for ``exp`` at ``proj_dim`` (StoreStateError: none
    recorded, or recorded for another ``kinv_scaling``)."""
    ev = store.eval_set(exp)
    records = {} if ev is None else ev.best_lambdas()
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
