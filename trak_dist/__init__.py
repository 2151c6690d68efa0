"""trak_dist: TRAK training-data attribution on many workers, one chunked Zarr store."""

from trak_dist._version import __version__
from trak_dist.api import Attribution, run
from trak_dist.config import JobConfig
from trak_dist.errors import (
    ConfigError,
    CudaExtUnavailableError,
    DataError,
    IllConditionedError,
    LabelError,
    NonFiniteError,
    StoreMismatchError,
    StoreStateError,
    TrakDistError,
    TrakerUsageError,
    WorkerFailedError,
)
from trak_dist.evaluation import Evaluation, evaluate
from trak_dist.projection import ProjectionKind, make_projector
from trak_dist.store import FeatureSpec, FeatureStore
from trak_dist.tasks import ImageClassification, ModelOutput, TextClassification
from trak_dist.traker import TRAKer

__all__ = [
    "Attribution",
    "ConfigError",
    "CudaExtUnavailableError",
    "DataError",
    "Evaluation",
    "FeatureSpec",
    "FeatureStore",
    "IllConditionedError",
    "ImageClassification",
    "JobConfig",
    "LabelError",
    "ModelOutput",
    "NonFiniteError",
    "ProjectionKind",
    "StoreMismatchError",
    "StoreStateError",
    "TRAKer",
    "TextClassification",
    "TrakDistError",
    "TrakerUsageError",
    "WorkerFailedError",
    "__version__",
    "evaluate",
    "make_projector",
    "run",
]
