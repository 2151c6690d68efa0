"""The Ray executor of the pipeline: worker and reducer actors, the driver loop, its retry
policy and Ctrl-C handling, and the eval driver. Plain classes re-exported from
``trak_dist.pipeline``."""

from trak_dist.pipeline import JobResult, Reducer, ShardResult, ShardTask, Worker

__all__ = ["JobResult", "RayExecutor", "Reducer", "ShardResult", "ShardTask", "Worker", "run_job"]


def __getattr__(name: str) -> object:
    # the driver imports Ray; load it only when asked for, so the plain classes stay Ray-free
    if name in ("run_job", "RayExecutor"):
        from trak_dist.distributed import driver

        return getattr(driver, name)
    raise AttributeError(name)
