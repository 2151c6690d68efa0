"""XᵀX, its factorisation, and block-wise scores: the settings (``ScoringConfig``), a
scoring's plan, its blocks and their merge, and the score step every executor runs."""

from trak_dist.scoring._ensure import cached_factor, ensure_factor, xtx_from_rows
from trak_dist.scoring._factor import (
    Factorization,
    gram,
    resolve_kinv_scaling,
)
from trak_dist.scoring._lambda import (
    AUTO,
    AUTO_SCALE,
    BEST,
    LambdaReg,
    auto_lambda,
    auto_rule,
    parse_lambda,
    rank_bound,
    resolve_best,
)
from trak_dist.scoring._plan import BlockResult, BlockTask, ScorePlan
from trak_dist.scoring._scorer import Scorer, ScoreResult
from trak_dist.scoring._settings import ScoreRequest, ScoringConfig
from trak_dist.scoring._step import ScoringSide, compute_scores, discards, score_step
from trak_dist.scoring._topk import TopK

__all__ = [
    "AUTO",
    "AUTO_SCALE",
    "BEST",
    "BlockResult",
    "BlockTask",
    "Factorization",
    "LambdaReg",
    "ScorePlan",
    "ScoreRequest",
    "ScoreResult",
    "Scorer",
    "ScoringConfig",
    "ScoringSide",
    "TopK",
    "auto_lambda",
    "auto_rule",
    "cached_factor",
    "compute_scores",
    "discards",
    "ensure_factor",
    "gram",
    "parse_lambda",
    "rank_bound",
    "resolve_best",
    "resolve_kinv_scaling",
    "score_step",
    "xtx_from_rows",
]
