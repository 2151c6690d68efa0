"""Scoring in three stages run by different processes (SLURM's array launcher): reduce,
factorise and prepare each variant's scoring (``prepare_from_store``); score blocks anywhere
(``BlockScorer``, each process a share of ``StagedScoring.blocks``); merge and publish
(``merge_from_store``: the same merge as ``Reducer.score``, in range order)."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

from trak_dist.config import JobConfig
from trak_dist.pipeline.executor import reducer_device
from trak_dist.pipeline.reducer import Reducer
from trak_dist.pipeline.results import FeaturizeReport, JobResult
from trak_dist.pipeline.run import Variants, job_result, reduce_stored
from trak_dist.scoring import (
    BlockResult,
    BlockTask,
    ScoreJobRef,
    ScoreRequest,
    ScoreResult,
    discards,
)


@dataclass(frozen=True)
class StagedScoring:
    """Prepared scorings (one per variant) whose blocks still have to run.

    Attributes:
        requests, jobs: each variant's request and its prepared scoring (``pending``: the
            blocks an earlier run had not committed).
        conditioning: condition number of XᵀX per checkpoint and p.
        reduce_s: seconds of reduce + factorise; started: epoch seconds when scoring began.
    """

    checkpoints: int
    requests: tuple[ScoreRequest, ...]
    jobs: tuple[ScoreJobRef, ...]
    conditioning: dict[int, dict[int, float]]
    reduce_s: float
    started: float

    @property
    def blocks(self) -> list[BlockTask]:
        """Every variant's pending blocks, variant by variant."""
        return [t for job in self.jobs for t in job.pending]

    def share(self, index: int, shares: int) -> list[BlockTask]:
        """Share ``index`` of ``shares``: contiguous, of about equal size (a share mostly stays
        in one super-block, whose Y its blocks read)."""
        blocks = self.blocks
        return blocks[index * len(blocks) // shares : (index + 1) * len(blocks) // shares]


def prepare_from_store(cfg: JobConfig, checkpoints: int, variants: Variants) -> StagedScoring:
    """XᵀX from the committed rows, factors, then each variant's Y, plan and unfinished set
    (an earlier run's committed blocks are kept: they are not pending)."""
    reducer, conditioning, reduce_s = reduce_stored(cfg, checkpoints, variants)
    started = time.time()
    ids = list(range(checkpoints))
    requests, jobs = [], []
    for p, lam in variants:
        request = ScoreRequest(cfg.scoring, tuple(ids), p, lam)
        reducer.prepare_scores(request)
        requests.append(request)
        jobs.append(reducer.hand_over())
    return StagedScoring(checkpoints, tuple(requests), tuple(jobs), conditioning, reduce_s, started)


def merge_from_store(
    cfg: JobConfig, staged: StagedScoring, results: list[BlockResult]
) -> JobResult:
    """Merge and publish each variant once every block is committed (StoreStateError naming
    how many are not); ``results``: the blocks the score tasks computed, any variant."""
    reducer = Reducer(cfg.store.path, reducer_device(cfg), cfg.store.options)
    scores: list[ScoreResult] = []
    for request, ref in zip(staged.requests, staged.jobs, strict=True):
        reducer.adopt(ref)
        mine = [r for r in results if r.task.group == ref.path]
        try:
            result = reducer.finish_scores(request, mine)
        except BaseException as e:
            reducer.stop_scores(discard=discards(e))
            raise
        # from the preparation in the first stage to this publish, queueing included
        scores.append(dataclasses.replace(result, seconds=time.time() - staged.started))
    phases = {"reduce": staged.reduce_s, "score": time.time() - staged.started}
    done = FeaturizeReport(rows_computed={}, rows_reused={})  # in the shard tasks' results
    return job_result(
        cfg, reducer.store, staged.checkpoints, scores, phases, staged.conditioning, done
    )
