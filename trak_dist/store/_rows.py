"""A set of featurised rows in the store: X, optional Q, row hashes H, per-chunk commit flags.

Invariant 3: several processes may write one RowSet only when each owns whole chunks, and a
chunk counts as done only once its flag is set, after its data was written. Flags live in a
``done`` array with one element per chunk and chunk size 1, so each flag is its own store key
and concurrent committers never share one. (LocalStore writes each key to a temporary file and
renames it, so a killed writer leaves either the old key or the new one.)

Integrity (store/_integrity.py): X, Q and H chunks carry a crc32c and a fill value committed
rows never hold (NaN, NaN, 0), so reads name damaged or missing chunks. H holds a 64-bit hash
of each row's train/target item, written with the row (store/_hashes.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import zarr

from trak_dist.errors import ConfigError
from trak_dist.store._codecs import CHECKSUM
from trak_dist.store._integrity import checked_read
from trak_dist.store._zarr import array


class RowSet:
    """Rows ``[0, n)`` of projected gradients in a Zarr group.

    Args:
        group: the group holding ``X`` (``[n, p]``), ``H`` (``[n]`` uint64), ``done``
            (``[ceil(n/chunk)]``) and optionally ``Q`` (``[n]``).
    """

    def __init__(self, group: zarr.Group) -> None:
        self.group = group
        self.X = array(group, "X")
        self.Q = array(group, "Q") if "Q" in group else None
        self.H = array(group, "H")
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
            fill_value=np.nan,
        )
        if with_q:
            group.create_array(
                "Q",
                shape=(n,),
                chunks=(chunk_rows,),
                dtype="float32",
                compressors=CHECKSUM,
                fill_value=np.nan,
            )
        group.create_array(
            "H",
            shape=(n,),
            chunks=(chunk_rows,),
            dtype="uint64",
            compressors=CHECKSUM,
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

    def write(
        self,
        start: int,
        x: np.ndarray,
        q: np.ndarray | None = None,
        h: np.ndarray | None = None,
    ) -> None:
        """Write rows ``[start, start + len(x))``: whole chunks only (see module docstring)."""
        end = start + x.shape[0]
        self.chunk_range(start, end)
        self._write(slice(start, end), x, q, h)

    def write_indices(
        self,
        inds: np.ndarray,
        x: np.ndarray,
        q: np.ndarray | None = None,
        h: np.ndarray | None = None,
    ) -> None:
        """Write arbitrary rows. Single writer only: misaligned concurrent writes lose rows."""
        self._write(np.asarray(inds, dtype=np.int64), x, q, h)

    def _write(
        self,
        rows: slice | np.ndarray,
        x: np.ndarray,
        q: np.ndarray | None,
        h: np.ndarray | None = None,
    ) -> None:
        if x.shape[1] != self.proj_dim:
            raise ConfigError(f"rows have {x.shape[1]} columns; the store holds {self.proj_dim}.")
        if isinstance(rows, slice):
            self.X[rows] = x.astype(self.X.dtype, copy=False)
        else:
            self.X.set_orthogonal_selection((rows, slice(None)), x.astype(self.X.dtype))
        if q is not None and self.Q is not None:
            if isinstance(rows, slice):
                self.Q[rows] = q.astype(np.float32, copy=False)
            else:
                self.Q.set_orthogonal_selection(rows, q.astype(np.float32))
        if h is not None:
            if isinstance(rows, slice):
                self.H[rows] = h.astype(np.uint64, copy=False)
            else:
                self.H.set_orthogonal_selection(rows, h.astype(np.uint64))

    def commit(self, start: int, end: int) -> None:
        """Mark the chunks of rows ``[start, end)`` done; call only after their data is written."""
        c0, c1 = self.chunk_range(start, end)
        self._done[c0:c1] = 1

    def commit_chunks(self, chunks: np.ndarray) -> None:
        for c in np.asarray(chunks, dtype=np.int64):
            self._done[int(c) : int(c) + 1] = 1

    def uncommit_chunks(self, chunks: np.ndarray) -> None:
        """Mark chunks not done (``store repair``), so the next run featurises them again."""
        for c in np.asarray(chunks, dtype=np.int64):
            self._done[int(c) : int(c) + 1] = 0

    def read(self, start: int, end: int, proj_dim: int | None = None) -> np.ndarray:
        """X rows ``[start, end)`` (the first ``proj_dim`` columns) as stored; raises
        StoreDamagedError for damaged chunks (see module docstring)."""
        return checked_read(self.X, (slice(start, end), slice(0, proj_dim or self.proj_dim)))

    def read_q(self, start: int, end: int) -> np.ndarray:
        if self.Q is None:
            raise ConfigError("this row set stores no Q (target rows have none).")
        return checked_read(self.Q, (slice(start, end),))

    def read_hashes(self, rows: slice | np.ndarray, checked: bool = False) -> np.ndarray:
        """``[len(rows)]`` uint64 item hashes as recorded (0: never written; ``checked``:
        StoreDamagedError instead, for committed rows)."""
        if isinstance(rows, slice):
            return checked_read(self.H, (rows,)) if checked else np.asarray(self.H[rows])
        return np.asarray(self.H.get_orthogonal_selection(np.asarray(rows, dtype=np.int64)))
