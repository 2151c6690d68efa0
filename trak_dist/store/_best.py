"""The best λ per proj_dim that ``trak-dist eval`` measured, kept beside its ground truth.

Stored in the attributes of ``eval/<exp>`` under ``best_lambda``, one record per proj_dim
(keys are the proj_dim as text: JSON has no integer keys). A record holds the λ
(``lambda_reg``: a number or ``"auto"``, and ``lambdas`` per checkpoint), the variant it came
from, its LDS and interval, the candidates' LDS, the ground truth it was measured on (recipe,
alpha, seed, models, targets) and when. It lives and dies with the subset models: discarding
them (``eval.overwrite=true``) discards the record too, so a record never outlives what it
was measured against.
"""

from __future__ import annotations

from typing import Any

from trak_dist.store._eval import EvalSet

KEY = "best_lambda"


def recorded_best(ev: EvalSet | None) -> dict[int, dict[str, Any]]:
    """Every recorded best λ of the eval set, by proj_dim (empty: none, or no eval set)."""
    if ev is None:
        return {}
    raw = ev.group.attrs.get(KEY) or {}
    return {int(p): dict(rec) for p, rec in raw.items()} if isinstance(raw, dict) else {}


def record_best(ev: EvalSet, proj_dim: int, record: dict[str, Any]) -> None:
    """Record (replace) the best λ at ``proj_dim``; one attribute write, so a reader sees the
    old records or the new ones, never a mix. Single writer: the evaluation's driver, under
    the store lock."""
    records = {str(p): rec for p, rec in recorded_best(ev).items()}
    records[str(int(proj_dim))] = record
    ev.group.attrs[KEY] = records
