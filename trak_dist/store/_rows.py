"""A set of featurised rows in the store: X, optional Q, per-chunk commit flags, staged rows.

Invariant 3: a chunk of X is only ever written whole, and counts as done only once its flag is
set, after its data was written. Flags live in a ``done`` array with one element per chunk and
chunk size 1, so each flag is its own store key and concurrent committers never share one.
(LocalStore writes each key to a temporary file and renames it, so a killed writer leaves either
the old key or the new one.) Two writers of one chunk therefore each write all of it, with the
same rows, and neither can lose the other's.

Two kinds of writers keep that rule:

- **Owners of whole chunks** (the Ray/SLURM workers' shards, or a TRAKer batch that happens to
  cover a chunk): ``write`` the chunk, then ``commit`` it. No coordination is needed.
- **Writers of arbitrary rows** (traker's ``featurize(batch, inds=…)`` from several processes,
  boundaries anywhere): ``write_rows`` stages the rows that do not fill a whole chunk in the
  writer's own shadow arrays (``_staging.py``), keys that only it writes. ``fold`` merges the
  shadows of every writer per chunk and writes (then commits) each chunk that their union covers.
  Callers fold under the store lock, so two folders never write one chunk at once (without a
  lock, e.g. a remote store, they would write the same whole chunk: still no lost rows).

Why this design rather than the alternatives: per-row flags in a shared array would put many
writers' flags in one chunk (the same lost-update race one level down), and a flag per key would
be n keys; one writer per chunk would force traker users to align their shards to chunks; a
lock around every partial-chunk write would make the pipeline's lock-free shard writes unsafe
whenever a TRAKer wrote at the same time. Staging costs one extra write and read of the rows
that do not fill whole chunks, and leaves the pipeline's fast path exactly as it was.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import zarr

from trak_dist.errors import ConfigError
from trak_dist.store._staging import STAGED, Shadow, shadows, staging
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
        self._own: dict[str, Shadow] = {}

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

    def _write(self, rows: slice, x: np.ndarray, q: np.ndarray | None) -> None:
        if x.shape[1] != self.proj_dim:
            raise ConfigError(f"rows have {x.shape[1]} columns; the store holds {self.proj_dim}.")
        self.X[rows] = x.astype(self.X.dtype, copy=False)
        if q is not None and self.Q is not None:
            self.Q[rows] = q.astype(np.float32, copy=False)

    def commit(self, start: int, end: int) -> None:
        """Mark the chunks of rows ``[start, end)`` done; call only after their data is written."""
        c0, c1 = self.chunk_range(start, end)
        self._done[c0:c1] = 1

    # ---- any rows, from any process, in any order (traker's API) -------------------------------
    def write_rows(
        self, inds: np.ndarray, x: np.ndarray, q: np.ndarray | None = None, *, writer: str
    ) -> np.ndarray:
        """Write rows ``inds``: the chunks they fill whole go to X and are committed; the other
        rows are staged in ``writer``'s shadow until ``fold`` finds their chunk complete.

        Args:
            inds: ``[B]`` distinct row indices, any order.
            x: ``[B, p]`` rows.
            q: ``[B]`` out-to-loss weights (train rows only).
            writer: a name no other process shares (e.g. a random hex string); one process
                may reuse it for any number of calls.

        Returns:
            The chunks that received staged rows: the ones worth folding now.
        """
        inds = self._check_rows(inds, x.shape[0])
        order = np.argsort(inds, kind="stable")
        inds, x = inds[order], x[order]
        q = None if q is None else q[order]
        chunk = inds // self.chunk_rows
        staged = np.ones(len(inds), dtype=bool)
        firsts, counts = np.unique(chunk, return_index=True, return_counts=True)[1:]
        for f, k in zip(firsts, counts, strict=True):
            start = int(chunk[f]) * self.chunk_rows
            if k == min(self.n, start + self.chunk_rows) - start:  # sorted, distinct: the chunk
                self.write(start, x[f : f + k], None if q is None else q[f : f + k])
                self.commit(start, start + k)
                staged[f : f + k] = False
        if staged.any():
            shadow = self._own.get(writer)
            if shadow is None:
                shadow = self._own[writer] = Shadow.open_or_create(
                    self.group, writer, self.X, self.Q is not None
                )
            shadow.write(inds[staged], x[staged], None if q is None else q[staged])
        return np.unique(chunk[staged])

    def _check_rows(self, inds: np.ndarray, batch: int) -> np.ndarray:
        inds = np.asarray(inds).reshape(-1)
        if inds.dtype.kind not in "iu":
            raise ConfigError(f"row indices must be integers; got dtype {inds.dtype}.")
        inds = inds.astype(np.int64)
        if len(inds) != batch:
            raise ConfigError(f"{len(inds)} row indices for a batch of {batch} samples.")
        if len(inds) and (inds.min() < 0 or inds.max() >= self.n):
            raise ConfigError(
                f"row indices span [{inds.min()}, {inds.max()}]; this set has rows [0, {self.n})."
            )
        if len(np.unique(inds)) != len(inds):
            raise ConfigError("row indices of one batch repeat; each sample needs its own row.")
        return inds

    def staged_rows(self) -> np.ndarray:
        """``[n]`` bool: rows staged by any writer and not folded yet."""
        out = np.zeros(self.n, dtype=bool)
        for shadow in shadows(self.group):
            out |= shadow.rows(0, self.n)
        return out

    def rows_done(self) -> np.ndarray:
        """``[n]`` bool: rows committed in X or staged by any writer (nobody needs to redo them)."""
        return np.repeat(self.done_chunks(), self.chunk_rows)[: self.n] | self.staged_rows()

    def fold(self, chunks: np.ndarray | None = None) -> int:
        """Write and commit every chunk (of ``chunks``; default: all) that staged rows cover.

        Call under the store lock. A full fold that leaves every chunk committed removes the
        staging area.

        Returns:
            The number of chunks committed.
        """
        if chunks is None:
            done = self.done_chunks()
            todo = np.flatnonzero(~done)
        else:
            todo = np.unique(np.asarray(chunks, dtype=np.int64))
            todo = todo[~np.asarray(self._done.get_orthogonal_selection(todo)).astype(bool)]
        writers = shadows(self.group) if len(todo) else []
        committed = 0
        for c in todo:
            start, end = int(c) * self.chunk_rows, min(self.n, (int(c) + 1) * self.chunk_rows)
            parts = [(w, w.rows(start, end)) for w in writers]
            if not np.logical_or.reduce([has for _, has in parts], initial=False).all():
                continue
            x = np.zeros((end - start, self.proj_dim), dtype=self.X.dtype)
            q = None if self.Q is None else np.zeros(end - start, dtype=np.float32)
            for w, has in parts:
                if has.any():
                    xw, qw = w.read(start, end)
                    x[has] = xw[has]
                    if q is not None and qw is not None:
                        q[has] = qw[has]
            self.write(start, x, q)
            self.commit(start, end)
            committed += 1
        if chunks is None and committed == len(todo) and staging(self.group) is not None:
            del self.group[STAGED]  # every row is in X now; shadows are garbage
            self._own.clear()
        return committed

    def read(self, start: int, end: int, proj_dim: int | None = None) -> np.ndarray:
        """X rows ``[start, end)`` (the first ``proj_dim`` columns) as stored."""
        return np.asarray(self.X[start:end, : proj_dim or self.proj_dim])

    def read_q(self, start: int, end: int) -> np.ndarray:
        if self.Q is None:
            raise ConfigError("this row set stores no Q (target rows have none).")
        return np.asarray(self.Q[start:end])
