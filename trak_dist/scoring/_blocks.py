"""Block-wise scores from the store, memory bounded by a budget, not by n or m (docs/design.md,
invariant 5 and "Scoring at scale").

Φ_c X_tcᵀ = X_c K_c⁻¹ X_tcᵀ = X_c Y_cᵀ with Y_c = X_tc K_c⁻¹ stored once per checkpoint; each
(train block × target block) of S is Σ_c X_c[b] Y_c[t]ᵀ / C times its rows' mean Q. Φ is never
formed and new targets cost only their Y. ``compute_scores`` runs a whole scoring in this
process: ``prepare_scoring`` (``_job.py``), every block (``_block.py``), the final merge. The
pipeline runs the same three steps with the blocks spread over workers."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from tqdm.auto import tqdm

from trak_dist.errors import TrakDistError
from trak_dist.scoring._block import score_block
from trak_dist.scoring._ensure import ensure_factor, xtx_from_rows
from trak_dist.scoring._job import prepare_scoring
from trak_dist.scoring._lambda import AUTO, LambdaReg
from trak_dist.scoring._plan import FULL_MAX_BYTES
from trak_dist.scoring._topk import TopList, merge_block
from trak_dist.store import FeatureStore, ScoreSet

__all__ = ["compute_scores", "ensure_factor", "xtx_from_rows"]


def _merge_topk(best: TopList | None, block: torch.Tensor, first_row: int, k: int) -> TopList:
    """``best`` merged with the exact top-k of ``block`` ``[r, t]`` (rows ``first_row …``):
    ``[k, t]`` values and rows, ties to the lower row (``_topk.py``; the serving index's merge)."""
    return merge_block(best, block, first_row, k)


def compute_scores(
    store: FeatureStore,
    exp: str,
    model_ids: Sequence[int],
    proj_dim: int | None = None,
    lambda_reg: LambdaReg = AUTO,
    kinv_scaling: str = "mean_abs",
    topk: int = 10,
    train_block: int = 4096,
    target_block: int = 1024,
    memory_bytes: int = 1 << 30,
    device: torch.device | str = "cpu",
    progress: bool = False,
    write_scores: str = "auto",
    full_max_bytes: int = FULL_MAX_BYTES,
    block_rows: int = 1 << 16,
) -> ScoreSet:
    """Score every target of ``exp`` against every train example, averaged over ``model_ids``
    (``lambda_reg`` a number, ``"auto"``, or ``"best"``: the λ ``trak-dist eval`` recorded for
    ``exp`` at this proj_dim; the λ used per checkpoint is recorded in ``lambdas``), holding at
    most about ``memory_bytes``; ``write_scores``: ``full`` (S and top-k), ``topk`` (top-k only) or
    ``auto`` (full up to ``full_max_bytes`` of S). The completed ScoreSet replaces the
    variant's previous scores only once complete; a run killed midway is resumed by the next
    (same plan), an error that would repeat (non-finite scores, a full disk) discards it."""
    job = prepare_scoring(
        store,
        exp,
        model_ids,
        proj_dim,
        lambda_reg,
        kinv_scaling,
        topk,
        train_block,
        target_block,
        memory_bytes,
        write_scores,
        full_max_bytes,
        block_rows,
        device,
    )
    try:
        for task in tqdm(job.pending, desc=f"scores {exp}/{job.variant}", disable=not progress,
                         unit="block"):  # fmt: skip
            job.record(score_block(store, task, device))
        return job.finish()
    except (TrakDistError, OSError):
        job.discard()
        raise
    finally:
        job.release()  # e.g. Ctrl-C: the set stays for a rerun, which needs the lease
