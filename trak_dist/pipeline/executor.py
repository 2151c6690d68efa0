"""Executors decide where the pipeline's tasks run; ``run_pipeline`` decides what runs.

``InProcessExecutor`` runs every task here (as submitit's ``debug``), ``RayExecutor`` on actors,
the SLURM array launcher as array tasks. Retries, restarts and Ctrl-C belong to an executor."""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from trak_dist.config import JobConfig
from trak_dist.pipeline._shards import ShardResult, ShardTask
from trak_dist.pipeline.plan import Prepared
from trak_dist.pipeline.reducer import Reducer
from trak_dist.pipeline.results import FeaturizeReport
from trak_dist.pipeline.worker import Worker
from trak_dist.scoring import ScoreRequest, ScoreResult

OnShard = Callable[[ShardResult], None]


def reducer_device(cfg: JobConfig) -> str:
    """Where the reducer factorises and scores: a GPU when it is given one."""
    return "cuda" if cfg.cluster.reducer_gpus > 0 else cfg.scoring.device


class TrainShardsLeft:
    """Train shards not yet reduced, per checkpoint: a checkpoint's XᵀX is written once its
    last shard's partial has been added."""

    def __init__(self, tasks: list[ShardTask]) -> None:
        self._left = Counter(t.model_id for t in tasks if t.kind == "train")

    def last(self, task: ShardTask) -> bool:
        """Count ``task`` as reduced; True when it was its checkpoint's last."""
        self._left[task.model_id] -= 1
        return self._left[task.model_id] == 0


class Executor(ABC):
    """Runs the tasks of one pipeline run, called in order: ``session`` (around everything),
    ``start``, ``featurize``, ``factorize``, then ``score`` per variant."""

    @contextmanager
    def session(self, cfg: JobConfig) -> Iterator[None]:
        """Resources held for the whole run (Ray, actors); released however the run ends."""
        yield

    @abstractmethod
    def start(self, cfg: JobConfig, prep: Prepared) -> None:
        """Bring up what the run needs (a cluster connection, the reducer)."""

    @abstractmethod
    def featurize(
        self, cfg: JobConfig, prep: Prepared, on_shard: OnShard | None
    ) -> FeaturizeReport:
        """Run every shard of ``prep``; add each train shard's partial XᵀX to the reducer and
        finish a checkpoint's XᵀX after its last shard."""

    @abstractmethod
    def factorize(self, model_ids: list[int], proj_dims: list[int]) -> dict[int, dict[int, float]]:
        """``Reducer.factorize`` wherever the reducer lives (after every checkpoint finished)."""

    @abstractmethod
    def score(self, request: ScoreRequest) -> ScoreResult:
        """``Reducer.score`` wherever the reducer lives."""


class InProcessExecutor(Executor):
    """Every task in this process, in plan order, with one plain Worker and Reducer: no Ray,
    no retries. ``reverse`` runs shards in reverse (tests: the result must not depend on it)."""

    def __init__(self, reverse: bool = False) -> None:
        self.reverse = reverse
        self.reducer: Reducer | None = None

    def _reducer(self) -> Reducer:
        if self.reducer is None:
            raise RuntimeError("InProcessExecutor.start was not called")
        return self.reducer

    def start(self, cfg: JobConfig, prep: Prepared) -> None:
        self.reducer = Reducer(cfg.store.path, reducer_device(cfg), cfg.store.options)

    def featurize(
        self, cfg: JobConfig, prep: Prepared, on_shard: OnShard | None
    ) -> FeaturizeReport:
        tasks = prep.train_tasks + prep.target_tasks
        report = FeaturizeReport()
        if not tasks:
            return report
        t0 = time.perf_counter()
        worker = Worker(cfg, prep.checkpoints, prep.width)
        t1 = time.perf_counter()
        reducer, left = self._reducer(), TrainShardsLeft(tasks)
        for task in reversed(tasks) if self.reverse else tasks:
            result, xtx = worker.run(task)
            report.rows_computed[task.kind] += result.rows_computed
            report.rows_reused[task.kind] += result.rows_reused
            if xtx is not None:
                reducer.add(task.model_id, task.start, task.end, xtx)
                if left.last(task):
                    reducer.finish_checkpoint(task.model_id)
            if on_shard is not None:
                on_shard(result)
        return FeaturizeReport(
            report.rows_computed,
            report.rows_reused,
            worker_start_s=t1 - t0,
            featurize_s=time.perf_counter() - t1,
        )

    def factorize(self, model_ids: list[int], proj_dims: list[int]) -> dict[int, dict[int, float]]:
        return self._reducer().factorize(model_ids, proj_dims)

    def score(self, request: ScoreRequest) -> ScoreResult:
        return self._reducer().score(request)
