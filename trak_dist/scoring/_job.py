"""A block-wise scoring in progress (``ScoreJob``, made by ``prepare_scoring``): its plan, its
unfinished score set, the blocks still to run; ``finish`` merges the blocks' top-k exactly, in
range order, and publishes. ``ScoreJobRef`` hands it to another process (SLURM's merge job)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from trak_dist.errors import StoreStateError
from trak_dist.scoring._plan import BlockResult, BlockTask, ScorePlan
from trak_dist.scoring._topk import TopList, merge
from trak_dist.store import FeatureStore, ScoreSet, ScoringLease


@dataclass
class ScoreJob:
    """One scoring in progress: its plan, its unfinished set and the blocks still to run
    (``pending``, super-block by super-block, ranges in order)."""

    store: FeatureStore
    exp: str
    variant: str
    plan: ScorePlan
    sset: ScoreSet
    pending: list[BlockTask]
    resumed: bool
    lambdas: list[float]
    bytes_read: int = 0
    bytes_written: int = 0
    blocks_computed: int = 0
    block_seconds: float = field(default=0.0)
    lease: ScoringLease | None = field(default=None, repr=False)

    @property
    def blocks(self) -> int:
        return len(self.plan.row_ranges) * len(self.plan.super_blocks)

    @property
    def blocks_reused(self) -> int:
        """Blocks an earlier run committed (not in ``pending``)."""
        return self.blocks - len(self.pending)

    def ref(self) -> ScoreJobRef:
        """A picklable handle on this scoring, for a process that finishes it later (SLURM's
        merge job): the blocks it still lacked at ``prepare_scoring`` stay its ``pending``."""
        return ScoreJobRef(
            self.exp,
            self.variant,
            self.plan,
            self.sset.group.path,
            tuple(self.pending),
            self.resumed,
            tuple(self.lambdas),
        )

    def release(self) -> None:
        """Give up the variant's lease (the unfinished set stays, for a rerun to resume)."""
        if self.lease is not None:
            self.lease.release()

    def discard(self) -> None:
        """Remove the unfinished set (an error a rerun would meet again) and the lease."""
        try:
            self.sset.discard()
        finally:
            self.release()

    def record(self, result: BlockResult) -> None:
        """Count a finished block's work (wherever it ran)."""
        self.bytes_read += result.bytes_read
        self.bytes_written += result.bytes_written
        self.blocks_computed += 1
        self.block_seconds += result.seconds

    def finish(self) -> ScoreSet:
        """Merge every range's partial top-k (in range order: the same bits whatever ran the
        blocks), write the final top-k, drop ``parts/`` and publish the set."""
        done = self.sset.parts.done_mask()
        if not done.all():
            missing = int((~done).sum())
            raise StoreStateError(
                f"{missing} score blocks of {self.sset.group.path} are not committed; run them "
                "(rerun the scoring: committed blocks are kept) before finishing."
            )
        k = min(self.plan.topk, self.plan.n)
        parts = self.sset.parts
        for t0, t1 in self.plan.super_blocks:
            best: TopList | None = None
            worst: TopList | None = None
            for r in range(len(self.plan.row_ranges)):
                got = parts.read(r, t0, t1)
                self.bytes_read += sum(v.nbytes for v in got.values())
                best = merge(best, _top(got, "proponents"), k)
                worst = merge(worst, _top(got, "opponents"), k)
            assert best is not None and worst is not None  # n ≥ 1: at least one range
            self.sset.write_topk(
                t0,
                {
                    "proponents_idx": best[1].T.numpy(),
                    "proponents_val": best[0].T.numpy(),
                    "opponents_idx": worst[1].T.numpy(),
                    "opponents_val": (-worst[0]).T.numpy(),
                },
            )
        self.sset.drop_parts()
        published = self.sset.publish()
        self.release()
        return published


@dataclass(frozen=True)
class ScoreJobRef:
    """``ScoreJob.ref()``: what another process needs to finish the scoring (no open store)."""

    exp: str
    variant: str
    plan: ScorePlan
    path: str  # the unfinished set's group in the store
    pending: tuple[BlockTask, ...]
    resumed: bool
    lambdas: tuple[float, ...]

    def open(self, store: FeatureStore) -> ScoreJob:
        """The scoring again, on ``store`` opened in this process; StoreStateError when its
        unfinished set is gone (a later scoring of the variant replaced it)."""
        sset = store.unfinished_scores(self.path, self.variant)
        return ScoreJob(
            store, self.exp, self.variant, self.plan, sset, list(self.pending), self.resumed,
            list(self.lambdas),
        )  # fmt: skip


def _top(got: dict[str, np.ndarray], side: str) -> TopList:
    return torch.from_numpy(got[f"{side}_val"].T.copy()), torch.from_numpy(
        got[f"{side}_idx"].T.copy()
    )
