"""Distributed featurisation and scoring: plain Worker/Reducer classes, a Ray driver."""

from trak_dist.distributed._state import JobResult
from trak_dist.distributed._tasks import ShardResult, ShardTask
from trak_dist.distributed.reducer import Reducer
from trak_dist.distributed.worker import Worker

__all__ = ["JobResult", "Reducer", "ShardResult", "ShardTask", "Worker", "run_job"]


def __getattr__(name: str) -> object:
    # the driver imports Ray; load it only when asked for, so the plain classes stay Ray-free
    if name == "run_job":
        from trak_dist.distributed import driver

        return getattr(driver, name)
    raise AttributeError(name)
