"""Executors decide where the pipeline's stages run; ``run_pipeline`` (``stages.py``) decides
what runs, in which order.

``InProcessExecutor`` runs every stage here (as submitit's ``debug``; ``cluster=inprocess``),
``RayExecutor`` on actors (``trak_dist.distributed``), ``SlurmExecutor`` as a chain of SLURM
jobs (``launch/``). Retries, restarts and Ctrl-C belong to an executor."""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from trak_dist.config import JobConfig, StoreConfig
from trak_dist.pipeline._shards import ShardResult
from trak_dist.pipeline.plan import Prepared
from trak_dist.pipeline.reducer import Reducer
from trak_dist.pipeline.results import FeaturizeReport
from trak_dist.pipeline.worker import Worker
from trak_dist.scoring import BlockResult, BlockTask, ScoringSide
from trak_dist.store import store_lock

OnShard = Callable[[ShardResult], None]


def reducer_device(cfg: JobConfig) -> str:
    """Where the reducer factorises and scores: a GPU when it is given one."""
    return "cuda" if cfg.cluster.reducer_gpus > 0 else cfg.scoring.device


class Executor(ABC):
    """Runs the stages of one pipeline run where it decides, called in ``run_pipeline``'s
    order: ``session`` (around everything), ``lock`` (around plan, featurize and reduce),
    ``start``, ``featurize``, ``reduce``, the score step (``scoring`` and ``run_blocks``), then
    ``conclude``."""

    @contextmanager
    def session(self, cfg: JobConfig) -> Iterator[None]:
        """Resources held for the whole run (Ray, actors); released however the run ends."""
        yield

    def lock(self, store: StoreConfig) -> AbstractContextManager[bool]:
        """The store's inter-process lock, held by the process that drives the stages (a
        lease object beside an object store)."""
        return store_lock(store.path, options=store.options)

    @abstractmethod
    def start(self, cfg: JobConfig, prep: Prepared) -> None:
        """Bring up what the run needs (a cluster connection, the reducer)."""

    @abstractmethod
    def featurize(self, cfg: JobConfig, prep: Prepared, on_shard: OnShard | None) -> Any:
        """Run every shard of ``prep`` (a ``FeaturizeReport``); an executor that keeps a
        reducer alive adds each train shard's partial XᵀX to it."""

    @abstractmethod
    def reduce(self, model_ids: list[int], proj_dims: list[int]) -> Any:
        """``Reducer.reduce`` wherever the reducer lives: XᵀX of each checkpoint not reduced
        from partials, its factors; the condition numbers."""

    @abstractmethod
    def scoring(self) -> ScoringSide:
        """The score step's side: where its prepare and finish run (the reducer)."""

    @abstractmethod
    def run_blocks(self, tasks: Any) -> Any:
        """The score step's blocks, wherever the executor runs them."""

    def conclude(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` once every stage has run (the run's result)."""
        return fn(*args, **kwargs)


class InProcessExecutor(Executor):
    """Every stage in this process, in plan order, with one plain Worker and Reducer: no Ray,
    no retries, errors raised where they happen. ``reverse`` runs shards in reverse (tests:
    the result must not depend on it)."""

    def __init__(self, reverse: bool = False) -> None:
        self.reverse = reverse

    def start(self, cfg: JobConfig, prep: Prepared) -> None:
        self.reducer = Reducer(cfg.store.path, reducer_device(cfg), cfg.store.options)
        self.progress = cfg.progress

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
        for task in reversed(tasks) if self.reverse else tasks:
            result, xtx = worker.run(task)
            report.rows_computed[task.kind] += result.rows_computed
            report.rows_reused[task.kind] += result.rows_reused
            if xtx is not None:
                self.reducer.add(task.model_id, task.start, task.end, xtx)
            if on_shard is not None:
                on_shard(result)
        return FeaturizeReport(
            report.rows_computed,
            report.rows_reused,
            worker_start_s=t1 - t0,
            featurize_s=time.perf_counter() - t1,
        )

    def reduce(self, model_ids: list[int], proj_dims: list[int]) -> dict[int, dict[int, float]]:
        return self.reducer.reduce(model_ids, proj_dims)

    def scoring(self) -> Reducer:
        return self.reducer

    def run_blocks(self, tasks: list[BlockTask]) -> list[BlockResult]:
        return self.reducer.run_blocks(tasks, self.progress)
