"""trak_dist: TRAK training-data attribution on many workers, one chunked Zarr store."""

from trak_dist.errors import (
    ConfigError,
    CudaExtUnavailableError,
    IllConditionedError,
    StoreMismatchError,
    StoreStateError,
    TrakDistError,
    WorkerFailedError,
)
from trak_dist.projection import ProjectionKind, make_projector

__all__ = [
    "ConfigError",
    "CudaExtUnavailableError",
    "IllConditionedError",
    "ProjectionKind",
    "StoreMismatchError",
    "StoreStateError",
    "TrakDistError",
    "WorkerFailedError",
    "make_projector",
]
__version__ = "0.1.0"
