"""The reducer: sums partial XᵀX, factorises once, streams score blocks. A plain class."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from trak_dist.errors import StoreStateError, TrakDistError
from trak_dist.pipeline.results import PREVIEW_TARGETS, ScoreRequest, ScoreResult, TopK
from trak_dist.scoring import (
    BlockResult,
    BlockTask,
    ScoreJob,
    ScoreJobRef,
    ensure_factor,
    prepare_scoring,
    score_block,
    xtx_from_rows,
)
from trak_dist.store import FeatureStore


class Reducer:
    """Accumulates each checkpoint's XᵀX from shard partials, then scores.

    Memory: two ``[p, p]`` float64 arrays (a sum and its rounding errors) per checkpoint being
    featurised, plus what a scoring needs (``scoring.memory``). Partials are added with TwoSum,
    so XᵀX is the float64 rounding of the exact sum (to ~K²·2⁻¹⁰⁶ relative): the same bits
    whatever the order partials arrive in or the number of workers."""

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
        self._sums: dict[int, np.ndarray] = {}
        self._errors: dict[int, np.ndarray] = {}
        self._covered: dict[int, list[tuple[int, int]]] = {}
        self._job: ScoreJob | None = None
        self._started = 0.0

    def add(self, model_id: int, start: int, end: int, xtx: np.ndarray) -> None:
        """Add the partial XᵀX of train rows ``[start, end)``."""
        spans = self._covered.setdefault(model_id, [])
        if any(s < end and start < e for s, e in spans):
            raise TrakDistError(
                f"rows [{start}, {end}) of model_id={model_id} were reduced twice; "
                "this is a bug in the driver's bookkeeping."
            )
        spans.append((start, end))
        if model_id not in self._sums:
            self._sums[model_id] = np.array(xtx, dtype=np.float64)
            self._errors[model_id] = np.zeros_like(self._sums[model_id])
            return
        total = self._sums[model_id]
        new = total + xtx
        back = new - total
        # TwoSum (Knuth): new + err == total + xtx exactly
        self._errors[model_id] += (total - (new - back)) + (xtx - back)
        self._sums[model_id] = new

    def finish_checkpoint(self, model_id: int) -> float:
        """Write XᵀX once every row is covered; returns the seconds it took."""
        t0 = time.perf_counter()
        n = self.store.spec.train_size
        spans = sorted(self._covered.get(model_id, []))
        covered = sum(e - s for s, e in spans)
        if covered != n:
            raise TrakDistError(
                f"model_id={model_id}: partial XᵀX cover {covered} of {n} train rows; "
                "every shard must be reduced once before finishing a checkpoint."
            )
        self.store.write_xtx(model_id, self._sums.pop(model_id) + self._errors.pop(model_id))
        return time.perf_counter() - t0

    def factorize(self, model_ids: list[int], proj_dims: list[int]) -> dict[int, dict[int, float]]:
        """Eigendecompose XᵀX[:p, :p] of each checkpoint for each p (once: cached in the store);
        returns the condition number of XᵀX per checkpoint and p."""
        conds: dict[int, dict[int, float]] = {}
        for model_id in model_ids:
            for p in sorted(set(proj_dims)):
                e = ensure_factor(self.store, model_id, p, self.device).eigenvalues
                low, top = float(e.min()), float(e.max())
                # rank-deficient XᵀX (p > n) has eigenvalues ≤ 0: infinite without λ
                conds.setdefault(model_id, {})[p] = top / low if low > 0 else float("inf")
        return conds

    def reduce_stored(self, model_id: int) -> None:
        """Write XᵀX of ``model_id`` from its committed rows, unless the store has it: the
        reduce step for features written without streaming partials (SLURM array tasks, the
        TRAKer API)."""
        rows = self.store.train_rows(model_id)
        missing = int((~rows.done_chunks()).sum())
        if missing:
            raise StoreStateError(
                f"model_id={model_id}: {missing} chunks of train rows are not featurised; an "
                "array task (or a featurize call) did not finish. Resubmit the array (or "
                "featurise those rows): committed chunks are kept."
            )
        if self.store.read_xtx(model_id) is None:
            self.store.write_xtx(model_id, xtx_from_rows(rows, 0, rows.n, device=self.device))

    def prepare_scores(self, request: ScoreRequest) -> list[BlockTask]:
        """Y, the plan and the unfinished score set of ``request``; returns the blocks it still
        lacks (an earlier run's committed blocks are kept). One scoring at a time."""
        r = request
        if self._job is not None:  # an earlier scoring of this reducer stopped midway
            self._job.release()
            self._job = None
        self._started = time.perf_counter()
        self._job = prepare_scoring(
            self.store,
            r.exp,
            list(r.model_ids),
            r.proj_dim,
            r.lambda_reg,
            r.kinv_scaling,
            r.topk,
            r.train_block,
            r.target_block,
            r.memory,
            r.write_scores,
            r.full_max_bytes,
            r.block_rows,
            self.device,
        )
        return list(self._job.pending)

    def hand_over(self) -> ScoreJobRef:
        """The prepared scoring as a handle another process finishes (``adopt``), after its
        blocks ran elsewhere (SLURM's score tasks); this reducer is free for the next one."""
        if self._job is None:
            raise TrakDistError("hand_over before prepare_scores: a bug in the launcher.")
        # the lease ends here: the processes that run the blocks and merge them cannot hold
        # this one's file lock (docs/slurm.md: one launch of a variant at a time)
        self._job.release()
        ref, self._job = self._job.ref(), None
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

    def run_block(self, task: BlockTask) -> BlockResult:
        """One block here (the in-process executor, SLURM's reduce job, TRAKer)."""
        return score_block(self.store, task, self.device)

    def finish_scores(self, request: ScoreRequest, results: list[BlockResult]) -> ScoreResult:
        """Merge the committed blocks, publish, and say what the scoring did (``results``: the
        blocks this run computed, wherever they ran)."""
        job = self._job
        if job is None:
            raise TrakDistError("finish_scores before prepare_scores: a bug in the executor.")
        for result in results:
            job.record(result)
        try:
            sset = job.finish()
        except (OSError, TrakDistError):
            self.discard_scores()
            raise
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

    def score(self, request: ScoreRequest) -> ScoreResult:
        """Score one variant into the store, every block here."""
        tasks = self.prepare_scores(request)
        try:
            results = [self.run_block(t) for t in tasks]
        except (OSError, TrakDistError):
            self.discard_scores()
            raise
        except BaseException:
            if self._job is not None:  # e.g. Ctrl-C: the set stays to resume, the lease goes
                self._job.release()
            raise
        return self.finish_scores(request, results)

    def discard_scores(self) -> None:
        """Remove the unfinished set after an error that a rerun would meet again (a full disk,
        non-finite scores): the variant's previous scores stay. A killed or interrupted
        scoring keeps its set, which the rerun resumes."""
        if self._job is not None:
            self._job.discard()
            self._job = None
