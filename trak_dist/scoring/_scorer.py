"""``Scorer``: one scoring at a time of a store, in this process: ``prepare_scores`` (Y, the
plan, the blocks still to run), the blocks (``run_blocks`` here, or anywhere), ``finish_scores``
(merge, publish) or ``stop_scores``. ``score_step`` runs them in that order for every
executor; ``hand_over`` / ``adopt`` carry a prepared scoring to another process (SLURM)."""

from __future__ import annotations

import time
from collections.abc import Mapping
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
from trak_dist.store import FeatureStore

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


class Scorer:
    """Scores variants of the store at ``store`` on ``device``, one at a time; holds what one
    scoring needs (``scoring.memory``) and the variant's lease until it publishes or stops."""

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
        self._job: ScoreJob | None = None
        self._started = 0.0

    def prepare_scores(self, request: ScoreRequest) -> list[BlockTask]:
        """Y, the plan and the unfinished score set of ``request``; returns the blocks it still
        lacks (an earlier run's committed blocks are kept)."""
        self.stop_scores()  # an earlier scoring stopped midway: its set stays for a rerun
        self._started = time.perf_counter()
        self._job = prepare_scoring(self.store, request, self.device)
        return list(self._job.pending)

    def run_block(self, task: BlockTask) -> BlockResult:
        return score_block(self.store, task, self.device)

    def run_blocks(self, tasks: list[BlockTask], progress: bool = False) -> list[BlockResult]:
        """Every block here, in order (the in-process executor, TRAKer, ``compute_scores``)."""
        bar = tqdm(tasks, desc="score blocks", disable=not progress, unit="block")
        return [self.run_block(t) for t in bar]

    def hand_over(self) -> ScoreJobRef:
        """The prepared scoring as a handle another process finishes (``adopt``) after its
        blocks ran elsewhere (SLURM's score tasks); this scorer is free for the next one."""
        if self._job is None:
            raise TrakDistError("hand_over before prepare_scores: a bug in the launcher.")
        # the lease ends here: the processes that run the blocks and merge them cannot hold
        # this one's file lock (docs/slurm.md: one launch of a variant at a time)
        ref = self._job.ref()
        self.stop_scores()
        return ref

    def adopt(self, ref: ScoreJobRef) -> None:
        """Take over a scoring another process prepared (``hand_over``): ``finish_scores``
        next. Its blocks are counted as reused unless they were in its ``pending``.

        Raises:
            StoreStateError: blocks are not committed (a score task did not run or finish);
                the unfinished set is kept, so a rerun computes only those.
        """
        job = ref.open(self.store)
        missing = int((~job.sset.parts.done_mask()).sum())
        if missing:
            raise StoreStateError(
                f"{missing} of {job.blocks} score blocks of {ref.path} are not committed: a "
                "score task did not finish. Rerun the launch: committed blocks are kept."
            )
        self._job = job
        self._started = time.perf_counter()

    def finish_scores(self, request: ScoreRequest, results: list[BlockResult]) -> ScoreResult:
        """Merge the committed blocks, publish, and say what the scoring did (``results``: the
        blocks this run computed, wherever they ran)."""
        job = self._job
        if job is None:
            raise TrakDistError("finish_scores before prepare_scores: a bug in the executor.")
        for result in results:
            job.record(result)
        sset = job.finish()
        self._job = None
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
        )

    def stop_scores(self, discard: bool = False) -> None:
        """End the scoring in progress, if any, giving its lease back; ``discard`` also removes
        its unfinished set (``score_step``'s rule), else the set stays for a rerun to resume."""
        job, self._job = self._job, None
        if job is not None:
            job.discard() if discard else job.release()
