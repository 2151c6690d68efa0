"""The pipeline, written once: plan → featurise shards → reduce XᵀX → factorise → score.

Plain stages (``Worker``, ``Reducer``, ``prepare``, ``run_pipeline``, ``finish_from_store``,
``prepare_from_store`` / ``merge_from_store``);
an ``Executor`` decides where tasks run. Never imports Ray, Hydra or submitit."""

from trak_dist.pipeline._shards import ShardResult, ShardTask, auto_shard_rows, shard_plan
from trak_dist.pipeline.block_scorer import BlockScorer
from trak_dist.pipeline.executor import (
    Executor,
    InProcessExecutor,
    OnShard,
    TrainShardsLeft,
    reducer_device,
)
from trak_dist.pipeline.inputs import absolute_store, resolve_inputs
from trak_dist.pipeline.plan import Prepared, check_combination, prepare
from trak_dist.pipeline.reducer import Reducer
from trak_dist.pipeline.results import FeaturizeReport, JobResult
from trak_dist.pipeline.run import finish_from_store, run_pipeline
from trak_dist.pipeline.staged import StagedScoring, merge_from_store, prepare_from_store
from trak_dist.pipeline.worker import Worker, pick_device

__all__ = [
    "BlockScorer",
    "Executor",
    "FeaturizeReport",
    "InProcessExecutor",
    "JobResult",
    "OnShard",
    "Prepared",
    "Reducer",
    "ShardResult",
    "ShardTask",
    "StagedScoring",
    "TrainShardsLeft",
    "Worker",
    "absolute_store",
    "auto_shard_rows",
    "check_combination",
    "finish_from_store",
    "merge_from_store",
    "pick_device",
    "prepare",
    "prepare_from_store",
    "reducer_device",
    "resolve_inputs",
    "run_pipeline",
    "shard_plan",
]
