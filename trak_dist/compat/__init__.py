"""traker 0.3.2 inside ``TRAKer``: its gradient computers and projectors called as traker
calls them (chosen only when a traker class is passed in), per-row bookkeeping on our store,
TRAKer's per-batch steps, and a read-only ``saver`` view."""

from trak_dist.compat._batches import fold_targets, write_batch
from trak_dist.compat._featurizer import DirectFeaturizer, make_featurizer, traker_classes
from trak_dist.compat._gradients import TrakerGradients, adapt_gradient_computer
from trak_dist.compat._projector import (
    TrakerProjector,
    adapt_projector,
    own_projector,
    projection_name,
)
from trak_dist.compat._saver import SaverView
from trak_dist.compat._tracker import RowTracker, fold_all, writer_name

__all__ = [
    "DirectFeaturizer",
    "RowTracker",
    "SaverView",
    "TrakerGradients",
    "TrakerProjector",
    "adapt_gradient_computer",
    "adapt_projector",
    "fold_all",
    "fold_targets",
    "make_featurizer",
    "own_projector",
    "projection_name",
    "traker_classes",
    "write_batch",
    "writer_name",
]
