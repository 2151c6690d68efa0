"""The pipeline, written once: resolve inputs → plan → featurise shards → reduce XᵀX →
factorise → score (``stages.py`` holds the order; ``run_pipeline`` runs it).

Plain stages (``resolve_inputs``, ``prepare``, ``Worker``, ``Reducer``: a ``Scorer``); an
``Executor`` decides where they run. Never imports Ray, Hydra or submitit."""

from trak_dist.pipeline._shards import ShardResult, ShardTask, auto_shard_rows, shard_plan
from trak_dist.pipeline.executor import (
    Executor,
    InProcessExecutor,
    OnShard,
    reducer_device,
)
from trak_dist.pipeline.inputs import absolute_store, resolve_inputs
from trak_dist.pipeline.plan import Prepared, check_combination, prepare
from trak_dist.pipeline.reducer import Reducer
from trak_dist.pipeline.results import FeaturizeReport, JobResult
from trak_dist.pipeline.stages import Variants, job_result, run_pipeline
from trak_dist.pipeline.worker import Worker, pick_device

__all__ = [
    "Executor",
    "FeaturizeReport",
    "InProcessExecutor",
    "JobResult",
    "OnShard",
    "Prepared",
    "Reducer",
    "ShardResult",
    "ShardTask",
    "Variants",
    "Worker",
    "absolute_store",
    "auto_shard_rows",
    "check_combination",
    "job_result",
    "pick_device",
    "prepare",
    "reducer_device",
    "resolve_inputs",
    "run_pipeline",
    "shard_plan",
]
