"""The commit protocol of a row set: one flag per chunk, set after the chunk's data.

Flags are a ``done`` array with chunk size 1: one store key each (written atomically), so
concurrent committers never share one; two writers of one chunk write the same rows."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import zarr

from trak_dist.errors import ConfigError, StoreDamagedError
from trak_dist.store._chunk_io import encode_rows, is_plain, store_chunks
from trak_dist.store._integrity import checked_read
from trak_dist.store._zarr import CHECKSUM


class CommitFlags:
    """The ``done`` flags (``[n_chunks]`` uint8, chunk size 1) of ``n`` rows in chunks of
    ``chunk_rows``."""

    def __init__(self, done: zarr.Array[Any], n: int, chunk_rows: int) -> None:
        self.done = done
        self.n = n
        self.chunk_rows = chunk_rows

    @staticmethod
    def create(group: zarr.Group, n: int, chunk_rows: int) -> None:
        group.create_array(
            "done",
            shape=(-(-n // chunk_rows),),
            chunks=(1,),
            dtype="uint8",
            compressors=CHECKSUM,
            fill_value=0,
        )

    @property
    def n_chunks(self) -> int:
        return int(self.done.shape[0])

    def span(self, c: int) -> tuple[int, int]:
        """The rows ``[start, end)`` of chunk ``c``."""
        return c * self.chunk_rows, min(self.n, (c + 1) * self.chunk_rows)

    def committed(self) -> np.ndarray:
        """``[n_chunks]`` bool: which chunks are committed (StoreDamagedError: a flag fails its
        checksum; ``store repair`` rewrites it)."""
        no_row_needs_a_flag = np.zeros(self.n_chunks, dtype=bool)  # 0 (absent) means not done
        return checked_read(self.done, (slice(0, self.n_chunks),), no_row_needs_a_flag) != 0

    def of(self, chunks: np.ndarray) -> np.ndarray:
        """The flags of ``chunks`` only (a fold follows every TRAKer batch)."""
        try:
            return np.asarray(self.done.get_orthogonal_selection(chunks)) != 0
        except ValueError:  # a flag fails its checksum: name it
            return self.committed()[chunks]

    def with_unreadable(self) -> tuple[np.ndarray, np.ndarray]:
        """``([n_chunks], [n_chunks])`` bool: committed chunks, and chunks whose flag cannot be
        read (``store verify``: their data decides whether they are committed)."""
        unreadable = np.zeros(self.n_chunks, dtype=bool)
        try:
            return self.committed(), unreadable
        except StoreDamagedError as e:
            for d in e.damage:
                unreadable[d.chunk[0]] = True  # type: ignore[attr-defined]
        done = np.zeros(self.n_chunks, dtype=bool)
        for c in np.flatnonzero(~unreadable).tolist():
            done[c] = bool(np.asarray(self.done[c : c + 1])[0])
        return done, unreadable

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
        done = self.committed()
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

    def commit(self, start: int, end: int) -> None:
        """Mark the chunks of rows ``[start, end)`` done; call only after their data is written."""
        c0, c1 = self.chunk_range(start, end)
        if is_plain(self.done):  # one store call for every flag (Zarr's is one per flag)
            store_chunks(
                self.done, encode_rows(self.done, slice(c0, c1), np.ones(c1 - c0, np.uint8))
            )
        else:
            self.done[c0:c1] = 1

    def set(self, chunks: np.ndarray, value: bool) -> None:
        """Set or clear the flags of ``chunks`` one key at a time (``store repair``)."""
        for c in np.asarray(chunks, dtype=np.int64).tolist():
            self.done[c : c + 1] = int(value)
