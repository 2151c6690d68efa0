"""The reducer: sums partial XᵀX, factorises once, then scores (a ``Scorer``). A plain class."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from trak_dist.errors import StoreStateError, TrakDistError
from trak_dist.scoring import (
    Scorer,
    ScoreRequest,
    ScoreResult,
    ensure_factor,
    score_step,
    xtx_from_rows,
)
from trak_dist.store import FeatureStore


class Reducer(Scorer):
    """Accumulates each checkpoint's XᵀX from shard partials, then scores. (With
    ``featurize.curvature=fisher`` the partials and the stored rows' Gram are GᵀG: the node
    keeps its name, the store's spec says which.)

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
        super().__init__(store, device, options)
        self._sums: dict[int, np.ndarray] = {}
        self._errors: dict[int, np.ndarray] = {}
        self._covered: dict[int, list[tuple[int, int]]] = {}

    def add(self, model_id: int, start: int, end: int, xtx: np.ndarray) -> None:
        """Add the partial XᵀX of train rows ``[start, end)``; the last one of a checkpoint
        writes its XᵀX."""
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
        else:
            total = self._sums[model_id]
            new = total + xtx
            back = new - total
            # TwoSum (Knuth): new + err == total + xtx exactly
            self._errors[model_id] += (total - (new - back)) + (xtx - back)
            self._sums[model_id] = new
        if sum(e - s for s, e in spans) == self.store.spec.train_size:
            self.store.write_xtx(model_id, self._sums.pop(model_id) + self._errors.pop(model_id))

    def reduce(self, model_ids: list[int], proj_dims: list[int]) -> dict[int, dict[int, float]]:
        """The reduce stage: XᵀX of each checkpoint the partials did not finish, from its
        committed rows (SLURM array tasks, TRAKer), then ``factorize``."""
        for model_id in model_ids:
            self.reduce_stored(model_id)
        return self.factorize(model_ids, proj_dims)

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
        """Write XᵀX of ``model_id`` from its committed rows, unless the store has it."""
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

    def score(self, request: ScoreRequest) -> ScoreResult:
        """Score one variant into the store, every block here (``score_step``)."""
        (result,) = score_step(self, [request], self.run_blocks)
        return result
