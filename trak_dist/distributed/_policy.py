"""When the Ray driver replaces a worker or reruns a shard, and when it gives up (the loop
reports, this decides, as xgboost_ray splits them). Committed chunks survive any failure."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from trak_dist import failures
from trak_dist.errors import TrakDistError, WorkerFailedError
from trak_dist.pipeline import ShardTask

logger = logging.getLogger("trak_dist.distributed.driver")


@dataclass
class RetryPolicy:
    """At most ``max_restarts`` dead workers replaced and ``max_retries`` reruns per shard;
    ``restarts`` and ``retries`` count them."""

    max_restarts: int
    max_retries: int
    restarts: int = 0
    retries: int = 0

    def worker_lost(self, what: str, e: Exception) -> None:
        """A worker died (or failed to start): replace it, unless past
        ``cluster.max_worker_restarts`` (WorkerFailedError)."""
        self.restarts += 1
        if self.restarts > self.max_restarts:
            raise WorkerFailedError(
                f"{what} and the job already replaced {self.max_restarts} workers "
                f"(cluster.max_worker_restarts). Last cause: {e}. Rerun the same command to resume "
                "from committed chunks."
            ) from e
        logger.warning("%s; replacing it", what)

    def task_failed(self, task: ShardTask, e: Exception) -> None:
        """A shard raised: rerun it unless the error was raised on purpose (TrakDistError:
        bad data, a mismatched store) or it is out of retries (WorkerFailedError)."""
        cause = failures.unwrap(e)
        if isinstance(cause, TrakDistError):
            raise cause from e
        what = failures.gist(cause)
        if task.attempt >= self.max_retries:
            raise WorkerFailedError(
                f"{task} failed {task.attempt + 1} times (featurize.max_task_retries="
                f"{self.max_retries}); last error: {what}. Fix the cause and "
                "rerun: committed chunks are kept."
            ) from e
        logger.warning("%s failed (%s); retrying", task, what)

    def rerun(self, task: ShardTask) -> ShardTask:
        self.retries += 1
        return task.retry()
