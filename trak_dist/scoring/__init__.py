"""XᵀX, its factorisation, and block-wise scores."""

from trak_dist.scoring._blocks import compute_scores, ensure_factor, xtx_from_rows
from trak_dist.scoring._factor import KINV_SCALINGS, Factorization, gram

__all__ = [
    "KINV_SCALINGS",
    "Factorization",
    "compute_scores",
    "ensure_factor",
    "gram",
    "xtx_from_rows",
]
