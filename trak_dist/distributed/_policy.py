"""When the Ray driver replaces a worker or reruns a shard, and when it gives up.

The driver's loop only reports what failed; this class decides (xgboost_ray's split of
``train``, the retry policy, from ``_train``, the loop). Committed chunks survive any failure, so
a job that gives up resumes where it stopped when rerun.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from trak_dist import failures
from trak_dist.errors import TrakDistError, WorkerFailedError
from trak_dist.pipeline import ShardTask

logger = logging.getLogger("trak_dist.distributed.driver")


@dataclass
class RetryPolicy:
    """At most ``max_restarts`` dead workers replaced and ``max_retries`` reruns per shard.

    Attributes:
        restarts: workers replaced so far.
        retries: shards rerun so far (after a worker died running them, or they raised).
    """

    max_restarts: int
    max_retries: int
    restarts: int = 0
    retries: int = 0

    def worker_lost(self, what: str, e: Exception) -> None:
        """A worker died (or failed to start): replace it, unless too many were replaced.

        Raises:
            WorkerFailedError: past ``cluster.max_worker_restarts``.
        """
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
