"""Array mode: each array task featurises its shards with the plain Worker (no Ray); a dependent
job builds XᵀX from the store, factorises and scores. Preempted tasks are requeued and resume."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import submitit

from trak_dist.config import JobConfig
from trak_dist.distributed import Reducer, ShardTask, Worker
from trak_dist.distributed._state import JobResult
from trak_dist.errors import StoreStateError
from trak_dist.scoring import xtx_from_rows
from trak_dist.store import FeatureStore, store_lock


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

    def __call__(self, tasks: list[ShardTask]) -> dict[str, int]:
        worker = Worker(self.cfg, self.checkpoints, self.width)
        out = {"shards": len(tasks), "rows_computed": 0, "rows_reused": 0}
        for task in tasks:
            result, _ = worker.run(task)  # the reduce job recomputes XᵀX from the store
            out["rows_computed"] += result.rows_computed
            out["rows_reused"] += result.rows_reused
        return out


def reduce_and_score(
    cfg: JobConfig, proj_dim: int, checkpoints: int, report_dir: Path
) -> dict[str, Any]:
    """The dependent job: XᵀX from the stored rows, factorisation, scores, report."""
    from trak_dist.report import summarize, write

    t0 = time.perf_counter()
    store = FeatureStore.open(cfg.store.path)
    n = store.spec.train_size
    ids = list(range(checkpoints))
    with store_lock(cfg.store.path):
        for mid in ids:
            rows = store.train_rows(mid)
            missing = int((~rows.done_chunks()).sum())
            if missing:
                raise StoreStateError(
                    f"model_id={mid}: {missing} chunks are not featurised; an array task failed. "
                    "Resubmit the array: committed chunks are kept."
                )
            if store.read_xtx(mid) is None:
                store.write_xtx(mid, xtx_from_rows(rows, 0, n))
        reducer = Reducer(cfg.store.path, cfg.scoring.device)
        reducer.factorize(ids, [proj_dim])
    t1 = time.perf_counter()
    s = cfg.scoring
    score = reducer.score(
        s.exp_name,
        ids,
        proj_dim,
        cfg.lambda_reg,
        s.kinv_scaling,
        s.topk,
        s.train_block,
        s.target_block,
    )
    result = JobResult(
        store=cfg.store.path,
        exp=s.exp_name,
        n=n,
        m=store.num_targets(s.exp_name),
        checkpoints=checkpoints,
        proj_dim=store.spec.proj_dim,
        scores=[score],
        phases={"reduce": t1 - t0, "score": time.perf_counter() - t1},
        rows_computed={},
        rows_reused={},
        worker_restarts=0,
        task_retries=0,
        conditioning={},
    )
    summary = summarize(result, cfg.data.train, cfg.data.targets, cfg.data.kwargs)
    report_dir.mkdir(parents=True, exist_ok=True)
    md, _ = write(summary, report_dir / (cfg.report or "trak_report"))
    summary["report"] = str(md)
    return summary
