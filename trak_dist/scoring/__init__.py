"""XᵀX, its factorisation, and block-wise scores."""

from trak_dist.scoring._best import best_record, resolve_best
from trak_dist.scoring._blocks import compute_scores, ensure_factor, xtx_from_rows
from trak_dist.scoring._factor import KINV_SCALINGS, Factorization, gram
from trak_dist.scoring._lambda import (
    AUTO,
    AUTO_SCALE,
    BEST,
    LambdaReg,
    auto_lambda,
    auto_rule,
    lambda_label,
    parse_lambda,
)

__all__ = [
    "AUTO",
    "AUTO_SCALE",
    "BEST",
    "KINV_SCALINGS",
    "Factorization",
    "LambdaReg",
    "auto_lambda",
    "auto_rule",
    "best_record",
    "compute_scores",
    "ensure_factor",
    "gram",
    "lambda_label",
    "parse_lambda",
    "resolve_best",
    "xtx_from_rows",
]
