"""The pipeline, written once: plan → featurise shards → reduce XᵀX → factorise → score.

Plain stages (``Worker``, ``Reducer``, ``prepare``, ``run_pipeline``, ``finish_from_store``,
``prepare_from_store`` / ``merge_from_store``);
an ``Executor`` decides where tasks run. Never imports Ray, Hydra or submitit."""

from trak_dist.pipeline._tasks import ShardResult, ShardTask, auto_shard_rows, shard_plan
from trak_dist.pipeline.executor import Executor, InProcessExecutor, reducer_device
from trak_dist.pipeline.plan import Prepared, check_combination, prepare
from trak_dist.pipeline.reducer import Reducer
from trak_dist.pipeline.results import FeaturizeReport, JobResult, ScoreRequest, ScoreResult, TopK
from trak_dist.pipeline.run import absolute_store, finish_from_store, run_pipeline
from trak_dist.pipeline.scorer import BlockScorer
from trak_dist.pipeline.staged import StagedScoring, merge_from_store, prepare_from_store
from trak_dist.pipeline.worker import Worker

__all__ = [
    "BlockScorer",
    "Executor",
    "FeaturizeReport",
    "InProcessExecutor",
    "JobResult",
    "Prepared",
    "Reducer",
    "ScoreRequest",
    "ScoreResult",
    "ShardResult",
    "ShardTask",
    "StagedScoring",
    "TopK",
    "Worker",
    "absolute_store",
    "auto_shard_rows",
    "check_combination",
    "finish_from_store",
    "merge_from_store",
    "prepare",
    "prepare_from_store",
    "reducer_device",
    "run_pipeline",
    "shard_plan",
]
