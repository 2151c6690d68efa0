"""The score step, written once for every executor and for TRAKer and ``trak-dist eval``'s λ
sweep: prepare (``Scorer.prepare_scores``) → the blocks, wherever the executor runs them →
finish (merge, publish), with one rule for what an error leaves behind (``discards``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import torch

from trak_dist.errors import TrakDistError, WorkerFailedError
from trak_dist.scoring._lambda import AUTO, LambdaReg
from trak_dist.scoring._plan import BlockResult, BlockTask
from trak_dist.scoring._scorer import Scorer, ScoreResult
from trak_dist.scoring._settings import ScoreRequest, ScoringConfig
from trak_dist.store import FeatureStore, ScoreSet


class ScoringSide(Protocol):
    """Where a scoring's state lives: a ``Scorer`` here, or a handle on one in another process
    (the Ray executor's reducer actor)."""

    def prepare_scores(self, request: ScoreRequest) -> list[BlockTask]: ...

    def finish_scores(self, request: ScoreRequest, results: list[BlockResult]) -> ScoreResult: ...

    def stop_scores(self, discard: bool = False) -> None: ...


def discards(error: BaseException) -> bool:
    """Whether ``error`` discards the unfinished score set: an error a rerun would meet again
    (a full disk, non-finite scores, a damaged store: any OSError or TrakDistError) does, and
    the variant's previous scores stay; a lost worker (``WorkerFailedError``), Ctrl-C or a
    killed process keeps the set and its committed blocks for the rerun to resume."""
    if isinstance(error, WorkerFailedError):
        return False
    return isinstance(error, OSError | TrakDistError)


def score_step(
    side: ScoringSide,
    request: ScoreRequest,
    run_blocks: Callable[[list[BlockTask]], list[BlockResult]],
) -> ScoreResult:
    """Prepare ``request`` on ``side``, run its pending blocks with ``run_blocks``, finish;
    on an error, stop the scoring as ``discards`` says and raise it."""
    tasks = side.prepare_scores(request)
    try:
        return side.finish_scores(request, run_blocks(tasks))
    except BaseException as e:
        side.stop_scores(discard=discards(e))
        raise


def compute_scores(
    store: FeatureStore,
    scoring: ScoringConfig,
    model_ids: Sequence[int],
    proj_dim: int | None = None,
    lambda_reg: LambdaReg = AUTO,
    device: torch.device | str = "cpu",
    progress: bool = False,
) -> ScoreSet:
    """Score every target of ``scoring.exp_name`` against every train example in this process,
    averaged over ``model_ids`` (``lambda_reg`` a number, ``"auto"``, or ``"best"``: the λ
    ``trak-dist eval`` recorded), with the settings ``scoring`` (its memory budget, what is
    written). The completed set replaces the variant's previous scores only once complete; a
    run killed midway is resumed by the next (same plan)."""
    scorer = Scorer(store, device)
    request = ScoreRequest(scoring, tuple(model_ids), proj_dim, lambda_reg)
    result = score_step(scorer, request, lambda tasks: scorer.run_blocks(tasks, progress))
    sset = store.score_set(scoring.exp_name, result.variant)
    if sset is None:  # just published: only a concurrent overwrite removes it
        raise TrakDistError(f"the scores {result.path} vanished after publishing.")
    return sset
