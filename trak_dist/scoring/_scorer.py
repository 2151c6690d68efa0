"""``Scorer``: the scorings of a store, in this process: ``prepare_scores`` (Y, the plan, the
blocks still to run, per variant), the blocks (``run_blocks`` here, or anywhere),
``finish_scores`` (merge, publish) or ``stop_scores``. ``score_step`` runs them in that order
for every executor; ``hand_over`` / ``adopt`` carry prepared scorings to another process."""

from __future__ import annotations

import dataclasses
import os
import socket
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from tqdm.auto import tqdm

from trak_dist.errors import StoreStateError, TrakDistError
from trak_dist.scoring._job import ScoreJob, ScoreJobRef
from trak_dist.scoring._lambda import LambdaReg
from trak_dist.scoring._plan import BlockResult, BlockTask
from trak_dist.scoring._prepare import prepare_scoring
from trak_dist.scoring._score_block import score_block
from trak_dist.scoring._settings import ScoreRequest
from trak_dist.scoring._topk import TopK
from trak_dist.store import FeatureStore, ScoreSet

# targets whose top-k proponents a score result carries back (the report reads no more)
PREVIEW_TARGETS = 100


@dataclass(frozen=True)
class ScoreResult:
    """One scored variant: its name and ``path`` in the store, the λ per checkpoint
    (``lambdas``) and the top-k of the first ``PREVIEW_TARGETS`` targets (``top``).

    Attributes:
        write_scores: ``full`` (S stored) or ``topk`` (only the top-k).
        super_block: targets per super-block; ``x_passes``: how many times every train row of
            X was read (one pass per super-block, over all checkpoints).
        blocks, blocks_computed, blocks_reused: score blocks in the plan, computed by this run
            (a block computed twice after a lost worker counts twice), committed by an earlier
            run and kept.
        bytes_read, bytes_written: by the blocks computed and the final merge (not Y).
        worker_restarts: score workers replaced during this scoring (Ray).
        block_seconds: the blocks' compute time, summed over the workers that ran them.
        kinv_scaling: how each checkpoint weighed in the mean (resolved: never ``auto``).
    """

    exp: str
    variant: str
    proj_dim: int
    lambda_reg: LambdaReg
    lambdas: tuple[float, ...]
    seconds: float
    path: str
    top: TopK
    write_scores: str = "full"
    super_block: int = 0
    x_passes: int = 0
    blocks: int = 0
    blocks_computed: int = 0
    blocks_reused: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    worker_restarts: int = 0
    block_seconds: float = 0.0
    kinv_scaling: str = "mean_abs"


class Scorer:
    """Scores variants of the store at ``store`` on ``device``: one batch of scorings at a time,
    holding what a block needs (``scoring.memory``) and each variant's lease until it publishes
    or stops."""

    def __init__(
        self,
        store: str | FeatureStore,
        device: str | torch.device = "cpu",
        options: Mapping[str, Any] | None = None,
    ) -> None:
        """``store``: an open store, or its path (``options``: its ``store.options``)."""
        self.store = (
            store if isinstance(store, FeatureStore) else FeatureStore.open(store, options=options)
        )
        self.device = torch.device(device)
        self._jobs: list[ScoreJob] = []
        self._started = 0.0
        self.name = f"{socket.gethostname()}:{os.getpid()}"  # BlockResult.worker

    def prepare_scores(self, requests: Sequence[ScoreRequest]) -> list[BlockTask]:
        """Y, the plan and the unfinished score set of each request; returns the blocks they
        still lack, variant by variant (an earlier run's committed blocks are kept)."""
        self.stop_scores()  # an earlier scoring stopped midway: its sets stay for a rerun
        self._started = time.perf_counter()
        for request in requests:
            self._jobs.append(prepare_scoring(self.store, request, self.device))
        return [t for job in self._jobs for t in job.pending]

    def run_block(self, task: BlockTask) -> BlockResult:
        """Compute and commit a block of any scoring of the store, wherever it was prepared:
        here, or on a Ray score actor or a SLURM score task (which wrap this class)."""
        return dataclasses.replace(score_block(self.store, task, self.device), worker=self.name)

    def committed(self, task: BlockTask) -> bool:
        """Whether the block has its commit flag (e.g. run before SLURM requeued its task)."""
        done = self.store.unfinished_scores(task.group).parts.done
        return bool(done[task.row_range, task.super_block])

    def run_blocks(self, tasks: list[BlockTask], progress: bool = False) -> list[BlockResult]:
        """Every block here, in order (the in-process executor, TRAKer, ``compute_scores``)."""
        bar = tqdm(tasks, desc="score blocks", disable=not progress, unit="block")
        return [self.run_block(t) for t in bar]

    def hand_over(self) -> list[ScoreJobRef]:
        """The prepared scorings as handles another process finishes (``adopt``) after their
        blocks ran elsewhere (SLURM's score tasks); this scorer is free for the next ones."""
        # the leases end here: the processes that run the blocks and merge them cannot hold
        # this one's file locks (docs/slurm.md: one launch of a variant at a time)
        refs = [job.ref() for job in self._jobs]
        self.stop_scores()
        return refs

    def adopt(self, refs: Sequence[ScoreJobRef]) -> None:
        """Take over scorings another process prepared (``hand_over``): ``finish_scores``
        next. Their blocks are counted as reused unless they were in their ``pending``.

        Raises:
            StoreStateError: blocks are not committed (a score task did not run or finish);
                the unfinished sets are kept, so a rerun computes only those.
        """
        self.stop_scores()
        for ref in refs:
            job = ref.open(self.store)
            missing = int((~job.sset.parts.done_mask()).sum())
            if missing:
                raise StoreStateError(
                    f"{missing} of {job.blocks} score blocks of {ref.path} are not committed: "
                    "a score task did not finish. Rerun the launch: committed blocks are kept."
                )
            self._jobs.append(job)
        self._started = time.perf_counter()

    def finish_scores(
        self, requests: Sequence[ScoreRequest], results: list[BlockResult]
    ) -> list[ScoreResult]:
        """Merge each scoring's committed blocks, publish, and say what it did (``results``:
        the blocks this run computed, wherever they ran, any variant)."""
        if len(self._jobs) != len(requests):
            raise TrakDistError("finish_scores without its prepare_scores: a bug in the executor.")
        out = []
        for request in requests:
            job = self._jobs[0]
            for result in results:
                if result.task.group == job.sset.group.path:
                    job.record(result)
            out.append(self._result(request, job, job.finish()))
            self._jobs.pop(0)  # published: nothing left to stop
        return out

    def _result(self, request: ScoreRequest, job: ScoreJob, sset: ScoreSet) -> ScoreResult:
        plan = job.plan
        return ScoreResult(
            exp=request.exp,
            variant=job.variant,
            proj_dim=plan.proj_dim,
            # best resolves to the recorded λ: report what was used
            lambda_reg=sset.attrs.get("lambda_reg", request.lambda_reg),
            lambdas=tuple(float(x) for x in job.lambdas),
            seconds=time.perf_counter() - self._started,
            path=f"{self.store.where}/scores/{request.exp}/{job.variant}",
            top=TopK.head(sset.read_topk(), PREVIEW_TARGETS),
            write_scores=plan.write_scores,
            super_block=plan.super_block,
            x_passes=plan.x_passes,
            blocks=job.blocks,
            blocks_computed=job.blocks_computed,
            blocks_reused=job.blocks_reused,
            bytes_read=job.bytes_read,
            bytes_written=job.bytes_written,
            block_seconds=job.block_seconds,
            kinv_scaling=sset.kinv_scaling,
        )

    def stop_scores(self, discard: bool = False) -> None:
        """End the scorings in progress, giving their leases back; ``discard`` also removes
        their unfinished sets (``score_step``'s rule), else they stay for a rerun to resume."""
        jobs, self._jobs = self._jobs, []
        for job in jobs:
            job.discard() if discard else job.release()
