"""A set of featurised rows in the store: X, optional Q, and per-chunk commit flags.

Invariant 3: several processes may write one RowSet only when each owns whole chunks, and a
chunk counts as done only once its flag is set, after its data was written. Flags live in a
``done`` array with one element per chunk and chunk size 1, so each flag is its own store key
and concurrent committers never share one. (LocalStore writes each key to a temporary file and
renames it, so a killed writer leaves either the old key or the new one.)
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import zarr

from trak_dist.errors import ConfigError, NonFiniteError
from trak_dist.store._zarr import array


class RowSet:
    """Rows ``[0, n)`` of projected gradients in a Zarr group.

    Args:
        group: the group holding ``X`` (``[n, p]``), ``done`` (``[ceil(n/chunk)]``) and
            optionally ``Q`` (``[n]``).
    """

    def __init__(self, group: zarr.Group) -> None:
        self.group = group
        self.X = array(group, "X")
        self.Q = array(group, "Q") if "Q" in group else None
        self._done = array(group, "done")
        self.n, self.proj_dim = self.X.shape
        self.chunk_rows = self.X.chunks[0]

    @classmethod
    def create(
        cls,
        group: zarr.Group,
        n: int,
        proj_dim: int,
        chunk_rows: int,
        dtype: str,
        compressors: Any,
        with_q: bool,
    ) -> RowSet:
        group.create_array(
            "X",
            shape=(n, proj_dim),
            chunks=(chunk_rows, proj_dim),
            dtype=dtype,
            compressors=compressors,
            fill_value=0,
        )
        if with_q:
            group.create_array(
                "Q",
                shape=(n,),
                chunks=(chunk_rows,),
                dtype="float32",
                compressors=None,
                fill_value=0,
            )
        n_chunks = -(-n // chunk_rows)
        group.create_array(
            "done", shape=(n_chunks,), chunks=(1,), dtype="uint8", compressors=None, fill_value=0
        )
        return cls(group)

    @property
    def n_chunks(self) -> int:
        return int(self._done.shape[0])

    def done_chunks(self) -> np.ndarray:
        """``[n_chunks]`` bool: which chunks are committed."""
        return np.asarray(self._done[:]).astype(bool)

    def is_complete(self) -> bool:
        return bool(self.done_chunks().all())

    def chunk_range(self, start: int, end: int) -> tuple[int, int]:
        """The chunks covering rows ``[start, end)``, which must be chunk-aligned."""
        if (
            start % self.chunk_rows
            or (end % self.chunk_rows and end != self.n)
            or not (0 <= start < end <= self.n)
        ):
            raise ConfigError(
                f"rows [{start}, {end}) are not aligned to the store's chunks of "
                f"{self.chunk_rows} rows (n={self.n}). Concurrent writers must own whole chunks; "
                "make shard sizes multiples of chunk_rows."
            )
        return start // self.chunk_rows, -(-end // self.chunk_rows)

    def pending_ranges(self, max_rows: int) -> Iterator[tuple[int, int]]:
        """Uncommitted rows as chunk-aligned ranges of at most ``max_rows`` (≥ one chunk)."""
        per = max(1, max_rows // self.chunk_rows)
        done = self.done_chunks()
        c = 0
        while c < self.n_chunks:
            if done[c]:
                c += 1
                continue
            e = c
            while e < self.n_chunks and not done[e] and e - c < per:
                e += 1
            yield c * self.chunk_rows, min(e * self.chunk_rows, self.n)
            c = e

    def write(self, start: int, x: np.ndarray, q: np.ndarray | None = None) -> None:
        """Write rows ``[start, start + len(x))``: whole chunks only (see module docstring)."""
        end = start + x.shape[0]
        self.chunk_range(start, end)
        self._write(slice(start, end), x, q)

    def write_indices(self, inds: np.ndarray, x: np.ndarray, q: np.ndarray | None = None) -> None:
        """Write arbitrary rows. Single writer only: misaligned concurrent writes lose rows."""
        self._write(np.asarray(inds, dtype=np.int64), x, q)

    def describe(self) -> str:
        """Whose rows these are, for messages: ``train rows of model_id=0``."""
        parts = self.group.path.strip("/").split("/")
        if parts[0] == "train" and len(parts) == 2:
            return f"train rows of model_id={parts[1]}"
        if parts[0] == "targets" and len(parts) == 3:
            return f"target rows of experiment {parts[1]!r}, model_id={parts[2]}"
        return f"rows of {self.group.path}"

    def _write(self, rows: slice | np.ndarray, x: np.ndarray, q: np.ndarray | None) -> None:
        if x.shape[1] != self.proj_dim:
            raise ConfigError(f"rows have {x.shape[1]} columns; the store holds {self.proj_dim}.")
        with np.errstate(over="ignore"):  # an overflow to inf is refused, with its cause, below
            stored = x.astype(self.X.dtype, copy=False)
        index = np.arange(rows.start, rows.stop) if isinstance(rows, slice) else rows
        refuse_non_finite(stored, x, q, index, self.describe())
        if isinstance(rows, slice):
            self.X[rows] = stored
        else:
            self.X.set_orthogonal_selection((rows, slice(None)), stored)
        if q is not None and self.Q is not None:
            if isinstance(rows, slice):
                self.Q[rows] = q.astype(np.float32, copy=False)
            else:
                self.Q.set_orthogonal_selection(rows, q.astype(np.float32))

    def commit(self, start: int, end: int) -> None:
        """Mark the chunks of rows ``[start, end)`` done; call only after their data is written."""
        c0, c1 = self.chunk_range(start, end)
        self._done[c0:c1] = 1

    def commit_chunks(self, chunks: np.ndarray) -> None:
        for c in np.asarray(chunks, dtype=np.int64):
            self._done[int(c) : int(c) + 1] = 1

    def read(self, start: int, end: int, proj_dim: int | None = None) -> np.ndarray:
        """X rows ``[start, end)`` (the first ``proj_dim`` columns) as stored."""
        return np.asarray(self.X[start:end, : proj_dim or self.proj_dim])

    def read_q(self, start: int, end: int) -> np.ndarray:
        if self.Q is None:
            raise ConfigError("this row set stores no Q (target rows have none).")
        return np.asarray(self.Q[start:end])


def refuse_non_finite(
    stored: np.ndarray, raw: np.ndarray, q: np.ndarray | None, rows: np.ndarray, who: str
) -> None:
    """Raise NonFiniteError unless every row is finite as stored (before anything is written).

    Args:
        stored: ``[B, p]`` rows in the store's dtype.
        raw: the same rows as computed (float32), to tell overflow in float16 from NaN input.
        q: ``[B]`` out-to-loss weights, or None.
        rows: ``[B]`` dataset row of each.
        who: whose rows (``RowSet.describe``).
    """
    # one pass over a chunk: negligible next to the gradients that produced it
    bad_x = ~np.isfinite(stored).all(axis=1)
    bad_q = np.zeros_like(bad_x) if q is None else ~np.isfinite(q)
    if not (bad_x.any() or bad_q.any()):
        return
    bad = bad_x | bad_q
    shown = rows[bad][:10].tolist()
    more = " …" if int(bad.sum()) > 10 else ""
    what = "projected gradients" if bad_x.any() else "Q (out-to-loss weights)"
    head = (
        f"non-finite {what} in {who}, rows {shown}{more} ({int(bad.sum())} of the {len(rows)} "
        "being written): nothing was written or committed."
    )
    if bad_x.any() and np.isfinite(raw[bad_x]).all():
        largest = float(np.abs(raw[bad_x]).max())
        raise NonFiniteError(
            f"{head} Their values (max |x| = {largest:.3g}) overflow the store's {stored.dtype}; "
            "store float32 features instead (featurize.half_precision=false, or "
            "use_half_precision=False) in a new store."
        )
    raise NonFiniteError(
        f"{head} Check those samples for NaN/inf values or labels outside the model's classes, "
        "and the checkpoint for NaN/inf weights; then rerun: committed chunks are kept."
    )
