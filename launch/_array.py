"""Array mode: each array task featurises its shards with the plain Worker (no Ray); a dependent
job runs the pipeline's reduce → factorise → score on what they committed
(``finish_from_store``). Preempted tasks are requeued and resume."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import submitit

from trak_dist.config import JobConfig
from trak_dist.pipeline import FeaturizeReport, ShardTask, Worker, finish_from_store


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


def reduce_and_score(
    cfg: JobConfig, proj_dim: int, checkpoints: int, report_dir: Path
) -> dict[str, Any]:
    """The dependent job: XᵀX from the stored rows, factorisation, scores; returns the report's
    summary (``summary["report"]``: its Markdown file)."""
    from trak_dist.report import summarize, write

    result = finish_from_store(cfg, checkpoints, [(proj_dim, cfg.lambda_reg)])
    summary = summarize(result, cfg.data.train, cfg.data.targets, cfg.data.kwargs)
    report_dir.mkdir(parents=True, exist_ok=True)
    md, _ = write(summary, report_dir / (cfg.report or "trak_report"))
    summary["report"] = str(md)
    return summary
