"""The committed blocks of an unfinished score set: each block's partial top-k and its flag.

``parts/`` inside a ``.partial-`` score set holds, per train-row range r, the top-k of every
target over those rows (``[R, m, k]``, one chunk per (range, super-block)) and ``done [R, S]``
(one chunk per flag). A block writes its data, then its flag: the commit protocol of row sets
(docs/design.md, invariant 3), so a rerun skips committed blocks and concurrent writers never
share a chunk. The final merge reads them in range order and drops ``parts/``."""

from __future__ import annotations

import numpy as np
import zarr

from trak_dist.store._integrity import checked_read
from trak_dist.store._layout import TOPK_ARRAYS
from trak_dist.store._zarr import CHECKSUM, array

PARTS = "parts"


class ScoreParts:
    """Partial top-k per (train-row range, target super-block) and their commit flags."""

    def __init__(self, group: zarr.Group) -> None:
        self.group = group
        self.done = array(group, "done")

    @classmethod
    def create(
        cls, parent: zarr.Group, ranges: int, blocks: int, m: int, k: int, width: int
    ) -> ScoreParts:
        """Arrays for ``ranges`` × ``blocks`` blocks of ``width`` targets (the super-block)."""
        group = parent.create_group(PARTS)
        for key in TOPK_ARRAYS:
            idx = key.endswith("idx")
            group.create_array(
                key,
                shape=(ranges, m, k),
                chunks=(1, min(m, width), max(k, 1)),
                dtype="int64" if idx else "float32",
                compressors=CHECKSUM,
                fill_value=-1 if idx else np.nan,
            )
        group.create_array(
            "done", shape=(ranges, blocks), chunks=(1, 1), dtype="uint8", fill_value=0
        )
        return cls(group)

    def done_mask(self) -> np.ndarray:
        """``[R, S]`` bool: which blocks are committed."""
        return np.asarray(self.done[:, :]).astype(bool)

    def write(self, r: int, s: int, t0: int, values: dict[str, np.ndarray]) -> int:
        """Block (r, s)'s top-k (each ``[t, k]``, targets from ``t0``), then its flag; returns
        the bytes written."""
        written = 0
        for key in TOPK_ARRAYS:
            v = values[key]
            array(self.group, key)[r, t0 : t0 + v.shape[0]] = v
            written += v.nbytes
        self.done[r, s] = 1  # after the data: a flag set means the block is durable
        return written + 1

    def read(self, r: int, t0: int, t1: int) -> dict[str, np.ndarray]:
        """Range ``r``'s top-k of targets ``[t0, t1)``, each ``[t1 - t0, k]`` (checked)."""
        out = {}
        for key in TOPK_ARRAYS:
            arr = array(self.group, key)
            sel = (slice(r, r + 1), slice(t0, t1), slice(0, arr.shape[2]))
            out[key] = checked_read(arr, sel)[0]
        return out
