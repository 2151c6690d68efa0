"""Array mode: each array task featurises its shards with the plain Worker (no Ray); a
dependent job reduces, factorises and prepares the scoring (``prepare_from_store``); a second
array scores its share of the blocks (``BlockScorer``); a last job merges them and writes the
report (``merge_from_store``). Preempted tasks are requeued and resume; a resubmitted launch
computes only the chunks and blocks not committed."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import submitit
import torch

from trak_dist.config import JobConfig
from trak_dist.errors import WorkerFailedError
from trak_dist.pipeline import (
    BlockScorer,
    FeaturizeReport,
    ShardTask,
    StagedScoring,
    Worker,
    merge_from_store,
    prepare_from_store,
    reducer_device,
)
from trak_dist.scoring import BlockResult


def split(tasks: list[ShardTask], parts: int) -> list[list[ShardTask]]:
    """``parts`` contiguous groups of about equal rows (contiguous: a group mostly stays on one
    checkpoint, so its worker loads it and generates its projection once)."""
    total = sum(t.rows for t in tasks)
    groups: list[list[ShardTask]] = [[] for _ in range(max(1, parts))]
    done = 0
    for t in tasks:
        groups[min(len(groups) - 1, done * len(groups) // max(1, total))].append(t)
        done += t.rows
    return [g for g in groups if g]


class ShardRunner(submitit.helpers.Checkpointable):
    """One array task. On preemption or time-out submitit requeues it with the same shards; the
    Worker then skips the chunks committed before the interruption."""

    def __init__(self, cfg: JobConfig, checkpoints: list[Path], width: int) -> None:
        self.cfg, self.checkpoints, self.width = cfg, checkpoints, width

    def __call__(self, tasks: list[ShardTask]) -> FeaturizeReport:
        worker = Worker(self.cfg, self.checkpoints, self.width)
        report = FeaturizeReport()
        for task in tasks:
            result, _ = worker.run(task)  # the reduce job recomputes XᵀX from the store
            report.rows_computed[task.kind] += result.rows_computed
            report.rows_reused[task.kind] += result.rows_reused
        return report


def output(result_file: Path) -> Any:
    """What an earlier job of the launch returned, read from its submitit result file (a
    later job cannot hold the Job itself: the local executor's does not pickle)."""
    outcome, value = submitit.core.utils.pickle_load(result_file)
    if outcome != "success":
        raise WorkerFailedError(f"the job that wrote {result_file} failed: {value}")
    return value


def use_allocation() -> None:
    """Torch's threads as the task's CPUs, not the node's cores (tasks share nodes; and Y and
    the blocks round alike in every task of the same size)."""
    cpus = os.environ.get("SLURM_CPUS_PER_TASK")
    if cpus:
        torch.set_num_threads(int(cpus))


def reduce_and_prepare(cfg: JobConfig, proj_dim: int, checkpoints: int) -> StagedScoring:
    """The first dependent job: XᵀX from the stored rows, factorisation, Y and the plan."""
    use_allocation()
    return prepare_from_store(cfg, checkpoints, [(proj_dim, cfg.lambda_reg)])


class ScoreRunner(submitit.helpers.Checkpointable):
    """One score array task: share ``share`` of ``shares`` of the prepared blocks (the reduce
    job's result file). Committed blocks are skipped, so a requeued task (or a rerun of the
    launch, whose reduce job plans only uncommitted blocks) redoes none."""

    def __init__(self, cfg: JobConfig, staged: Path) -> None:
        self.cfg, self.staged = cfg, staged

    def __call__(self, share: int, shares: int) -> list[BlockResult]:
        staged: StagedScoring = output(self.staged)
        use_allocation()
        scorer = BlockScorer(self.cfg.store.path, reducer_device(self.cfg))
        tasks = staged.share(share, shares)
        return [scorer.run(t) for t in tasks if not scorer.committed(t)]


def merge_and_report(
    cfg: JobConfig, staged: Path, blocks: list[Path], report_dir: Path
) -> dict[str, Any]:
    """The last job: merge every committed block, publish, and return the report's summary
    (``summary["report"]``: its Markdown file)."""
    from trak_dist.report import summarize, write

    results = [r for path in blocks for r in output(path)]
    result = merge_from_store(cfg, output(staged), results)
    summary = summarize(result, cfg.data.train, cfg.data.targets, cfg.data.kwargs)
    report_dir.mkdir(parents=True, exist_ok=True)
    md, _ = write(summary, report_dir / (cfg.report or "trak_report"))
    summary["report"] = str(md)
    return summary
