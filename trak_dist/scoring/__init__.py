"""XᵀX, its factorisation, and block-wise scores: the settings (``ScoringConfig``), a
scoring's plan, its blocks and their merge, and the score step every executor runs."""

from trak_dist.scoring._ensure import ensure_factor, xtx_from_rows
from trak_dist.scoring._factor import KINV_SCALINGS, Factorization, gram
from trak_dist.scoring._job import ScoreJob, ScoreJobRef
from trak_dist.scoring._lambda import (
    AUTO,
    AUTO_SCALE,
    BEST,
    LambdaReg,
    auto_lambda,
    auto_rule,
    best_record,
    lambda_label,
    parse_lambda,
    resolve_best,
)
from trak_dist.scoring._plan import BlockResult, BlockTask, ScorePlan
from trak_dist.scoring._prepare import prepare_scoring
from trak_dist.scoring._score_block import score_block
from trak_dist.scoring._scorer import PREVIEW_TARGETS, Scorer, ScoreResult
from trak_dist.scoring._settings import (
    BLOCK_ROWS,
    FULL_MAX_BYTES,
    MEMORY_DEFAULT,
    WRITE_MODES,
    ScoreRequest,
    ScoringConfig,
    parse_bytes,
)
from trak_dist.scoring._step import ScoringSide, compute_scores, discards, score_step
from trak_dist.scoring._topk import TopK

__all__ = [
    "AUTO",
    "AUTO_SCALE",
    "BEST",
    "BLOCK_ROWS",
    "FULL_MAX_BYTES",
    "KINV_SCALINGS",
    "MEMORY_DEFAULT",
    "PREVIEW_TARGETS",
    "WRITE_MODES",
    "BlockResult",
    "BlockTask",
    "Factorization",
    "LambdaReg",
    "ScoreJob",
    "ScoreJobRef",
    "ScorePlan",
    "ScoreRequest",
    "ScoreResult",
    "Scorer",
    "ScoringConfig",
    "ScoringSide",
    "TopK",
    "auto_lambda",
    "auto_rule",
    "best_record",
    "compute_scores",
    "discards",
    "ensure_factor",
    "gram",
    "lambda_label",
    "parse_bytes",
    "parse_lambda",
    "prepare_scoring",
    "resolve_best",
    "score_block",
    "score_step",
    "xtx_from_rows",
]
