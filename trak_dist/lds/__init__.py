"""The linear datamodeling score (LDS): how well scores predict retrained models' outputs.

The measurement only; ``trak_dist.distributed.eval_driver`` runs the subset models and imports
this package, never the reverse (docs/design.md, "Import rules")."""

from __future__ import annotations

from trak_dist.lds._metric import LDSResult, lds, predictions, spearman
from trak_dist.lds._output import best, to_markdown, write
from trak_dist.lds._retrain import SubsetTrainer
from trak_dist.lds._scores import VariantLDS, score_predictions, store_lds

__all__ = [
    "LDSResult",
    "SubsetTrainer",
    "VariantLDS",
    "best",
    "lds",
    "predictions",
    "score_predictions",
    "spearman",
    "store_lds",
    "to_markdown",
    "write",
]
