"""The linear datamodeling score (LDS): how well scores predict retrained models' outputs.

The measurement only: the metric, the LDS of a store's score sets against stored subset-model
outputs, the tables, and ``SubsetTrainer`` (one subset model's target outputs, a plain class).
Running the subset models is orchestration: ``trak_dist.evaluate`` (``trak_dist.evaluation``)
and ``trak-dist eval`` drive them through ``trak_dist.distributed.eval_driver``, which imports
this package, never the reverse (docs/design.md, "Import rules").
"""

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
