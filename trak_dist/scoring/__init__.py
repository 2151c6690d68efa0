"""XᵀX, its factorisation, and block-wise scores (a scoring's plan, its blocks, their merge)."""

from trak_dist.scoring._best import best_record, resolve_best
from trak_dist.scoring._block import score_block
from trak_dist.scoring._blocks import compute_scores, ensure_factor, xtx_from_rows
from trak_dist.scoring._factor import KINV_SCALINGS, Factorization, gram
from trak_dist.scoring._job import ScoreJob, ScoreJobRef, prepare_scoring
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
from trak_dist.scoring._plan import (
    BLOCK_ROWS,
    FULL_MAX_BYTES,
    MEMORY_DEFAULT,
    WRITE_MODES,
    BlockResult,
    BlockTask,
    ScorePlan,
    parse_bytes,
)

__all__ = [
    "AUTO",
    "AUTO_SCALE",
    "BEST",
    "BLOCK_ROWS",
    "FULL_MAX_BYTES",
    "KINV_SCALINGS",
    "MEMORY_DEFAULT",
    "WRITE_MODES",
    "BlockResult",
    "BlockTask",
    "Factorization",
    "LambdaReg",
    "ScoreJob",
    "ScoreJobRef",
    "ScorePlan",
    "auto_lambda",
    "auto_rule",
    "best_record",
    "compute_scores",
    "ensure_factor",
    "gram",
    "lambda_label",
    "parse_bytes",
    "parse_lambda",
    "prepare_scoring",
    "resolve_best",
    "score_block",
    "xtx_from_rows",
]
