"""TRAKer's bookkeeping of which rows a process still has to compute, and how it writes them."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from trak_dist.errors import ConfigError, StoreStateError, TrakerUsageError
from trak_dist.store import RowSet, store_lock


class RowTracker:
    """The rows of one row set this process still has to compute, and the ``num_samples=``
    cursor (consecutive calls fill consecutive rows, as in traker).

    ``done`` is a load-time snapshot of rows committed or staged from ``checkpoint`` (rows
    staged later elsewhere are recomputed: only work is lost). Writes stage under ``writer``
    with item hashes, and fold whole chunks at once when the store lock is free."""

    def __init__(
        self,
        rows: RowSet,
        where: str,
        writer: str,
        checkpoint: str,
        options: Mapping[str, Any] | None = None,
    ) -> None:
        self.rows = rows
        self.where = where
        self.options = options
        self.writer = writer
        self.checkpoint = checkpoint
        self.done = rows.staged.rows_done(checkpoint)
        self.cursor = 0

    def take(self, inds: Iterable[int] | None, num_samples: int | None) -> np.ndarray:
        """The rows of the next batch: ``inds``, or the next ``num_samples`` rows."""
        if (inds is None) == (num_samples is None):
            raise TrakerUsageError("Exactly one of num_samples and inds should be specified.")
        if inds is not None:
            rows = np.asarray(inds.cpu() if hasattr(inds, "cpu") else inds).reshape(-1)
        else:
            rows = np.arange(self.cursor, self.cursor + int(num_samples), dtype=np.int64)  # type: ignore[arg-type]
            self.cursor += len(rows)
        if len(rows) and (rows.min() < 0 or rows.max() >= self.rows.n):
            raise ConfigError(
                f"rows [{rows.min()}, {rows.max()}] fall outside the {self.rows.n} rows of this "
                "set. Check inds=, or num_samples= against train_set_size / num_targets."
            )
        return rows.astype(np.int64)

    def pending(self, inds: np.ndarray) -> np.ndarray:
        return ~self.done[inds]

    def recorded_hashes(self, inds: np.ndarray) -> np.ndarray:
        """``[B]`` the item hashes rows ``inds`` were featurised from (committed or staged)."""
        return self.rows.staged.recorded_hashes(inds, self.checkpoint)

    def write(
        self,
        inds: np.ndarray,
        x: np.ndarray,
        q: np.ndarray | None,
        h: np.ndarray,
        g: np.ndarray | None = None,
    ) -> None:
        """Stage rows ``inds`` (``g``: ``[B, D, p]`` their Fisher rows where the set holds G)."""
        touched = self.rows.staged.write_rows(
            inds, x, q, h=h, writer=self.writer, checkpoint=self.checkpoint, g=g
        )
        self.done[inds] = True
        # only chunks complete as far as this process knows; rows other processes stage after
        # our snapshot complete theirs, and finalize folds the rest (saves a fold per batch)
        size = self.rows.chunk_rows
        whole = [c for c in touched if self.done[c * size : (c + 1) * size].all()]
        if whole:
            with store_lock(self.where, wait=False, options=self.options) as free:
                if free:
                    self.rows.staged.fold(np.asarray(whole), self.checkpoint)


def writer_name() -> str:
    """A staging writer name no other process can share (one per TRAKer)."""
    return f"w{os.getpid()}-{uuid.uuid4().hex[:12]}"


def fold_all(rows: RowSet, what: str, noun: str, checkpoint: str | None = None) -> None:
    """Fold every row staged from ``checkpoint`` (default: the one the rows are bound to) into
    X (caller holds the store lock); error if rows are missing."""
    rows.staged.fold(None, checkpoint)
    if rows.is_complete():
        return
    missing = np.flatnonzero(~rows.staged.rows_done(checkpoint))
    raise StoreStateError(
        f"{what}: {len(missing)} of {rows.n} {noun} have no features yet (e.g. rows "
        f"{missing[:5].tolist()}). Featurise every row first (any process may fill any rows)."
    )
