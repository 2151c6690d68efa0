"""The linear datamodeling score (LDS): how well scores predict retrained models' outputs.

The measurement only; ``trak_dist.distributed.eval_driver`` runs the subset models and imports
this package, never the reverse (docs/design.md, "Import rules")."""

from __future__ import annotations

from trak_dist.lds._metric import LDSResult, lds, predictions, spearman
from trak_dist.lds._output import best, to_markdown, write
from trak_dist.lds._retrain import SubsetTrainer
from trak_dist.lds._scores import VariantLDS, score_predictions, store_lds
from trak_dist.lds._sweep import (
    best_by_proj_dim,
    expand_lambdas,
    record_best_lambdas,
    score_lambdas,
)

__all__ = [
    "LDSResult",
    "SubsetTrainer",
    "VariantLDS",
    "best",
    "best_by_proj_dim",
    "expand_lambdas",
    "lds",
    "predictions",
    "record_best_lambdas",
    "score_lambdas",
    "score_predictions",
    "spearman",
    "store_lds",
    "to_markdown",
    "write",
]
