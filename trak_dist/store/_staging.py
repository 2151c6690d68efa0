"""Rows staged by one writer: private arrays shaped like the row set, holding only its rows.

Two processes writing rows of one Zarr chunk silently lose each other's rows, so a writer puts
rows that do not fill a whole chunk into its own shadow arrays under ``staged/<writer>/``
(``X``, ``Q``, ``H``, ``has``, and the sampled-label Fisher's ``G``, ``G1`` … where the row set
holds them, chunked like the row set), keys no other process writes;
``StagedRows.fold`` (``_fold.py``) merges them. ``has`` flags are written last (every key is
replaced atomically), so a killed writer leaves unflagged rows that are recomputed. A shadow
records its writer's checkpoint; rows from another checkpoint than the bound one are never
folded nor reused. Chunks carry crc32c and sentinel fills; a damaged shadow is dropped by
``trak-dist store repair``."""

from __future__ import annotations

from typing import Any

import numpy as np
import zarr
from zarr.errors import ContainsGroupError

from trak_dist.store._chunk_io import as_stored
from trak_dist.store._integrity import checked_read
from trak_dist.store._layout import CHECKPOINT, STAGED, column_blocks
from trak_dist.store._zarr import CHECKSUM, array, group, quiet_foreign_nodes


class Shadow:
    """One writer's staged rows in ``node`` (``staged/<writer>``): ``X`` ``[n, p]``, ``H``
    ``[n]`` uint64, ``has`` ``[n]`` uint8, optionally ``Q`` ``[n]`` and one ``[n, p]`` array per
    label draw of the Fisher's rows (``G``, ``G1`` …, as the row set's)."""

    def __init__(self, node: zarr.Group) -> None:
        self.name = node.basename
        self.checkpoint: str | None = node.attrs.get(CHECKPOINT)  # type: ignore[assignment]
        self.X = array(node, "X")
        self.Q = array(node, "Q") if "Q" in node else None
        self.g_draws = [array(node, name) for name in _g_names(node)]
        self.H = array(node, "H")
        self.has = array(node, "has")

    @classmethod
    def open_or_create(
        cls,
        rows_group: zarr.Group,
        writer: str,
        like: zarr.Array[Any],
        with_q: bool,
        checkpoint: str | None,
        g_draws: int = 0,
    ) -> Shadow:
        """``writer``'s shadow arrays beside ``like``, created if new; a shadow staged from
        another checkpoint (a new checkpoint under one model_id) is discarded first."""
        staged = staging(rows_group, create=True)
        assert staged is not None  # created above
        if writer in staged:
            node = group(staged, writer)
            if "has" in node and node.attrs.get(CHECKPOINT) == checkpoint:
                return cls(node)
            # only this writer ever writes these keys: a shadow half made by an earlier attempt
            # of this process, or one of another checkpoint, is simply made again
            del staged[writer]
        node = staged.create_group(writer, attributes={CHECKPOINT: checkpoint})
        n, p = like.shape
        chunk = like.chunks[0]
        for name in ["X", *("G" if d == 0 else f"G{d}" for d in range(g_draws))]:
            node.create_array(
                name,
                shape=(n, p),
                chunks=like.chunks,  # the row set's (bounded in bytes, store/_layout.py)
                dtype=like.dtype,
                compressors=CHECKSUM,
                fill_value=np.nan,
            )
        if with_q:
            node.create_array(
                "Q",
                shape=(n,),
                chunks=(chunk,),
                dtype="float32",
                compressors=CHECKSUM,
                fill_value=np.nan,
            )
        node.create_array(
            "H", shape=(n,), chunks=(chunk,), dtype="uint64", compressors=CHECKSUM, fill_value=0
        )
        # created last: a shadow without it is a writer killed while creating it, and is skipped
        node.create_array(
            "has", shape=(n,), chunks=(chunk,), dtype="uint8", compressors=CHECKSUM, fill_value=0
        )
        return cls(node)

    def write(
        self,
        inds: np.ndarray,
        x: np.ndarray,
        q: np.ndarray | None,
        h: np.ndarray,
        g: np.ndarray | None = None,
    ) -> None:
        """Stage rows ``inds`` (sorted, unique), with ``g`` ``[B, D, p]`` the Fisher's rows where
        the shadow holds them; their flags are set after their data. X (and G) go one column
        chunk at a time: Zarr reads, patches and rewrites every chunk a row touches, and a wide
        row touches many (``_layout.py``)."""
        per_draw = [] if g is None else [g[:, d] for d in range(g.shape[1])]
        for arr, values in [(self.X, x), *zip(self.g_draws, per_draw, strict=True)]:
            values = as_stored(values, arr.dtype)  # the store's cast, bits as astype
            for cols in column_blocks(arr):
                arr.set_orthogonal_selection((inds, cols), values[:, cols])
        if q is not None and self.Q is not None:
            self.Q.set_orthogonal_selection(inds, q.astype(np.float32, copy=False))
        self.H.set_orthogonal_selection(inds, h.astype(np.uint64, copy=False))
        self.has.set_orthogonal_selection(inds, np.ones(len(inds), np.uint8))

    def rows(self, start: int, end: int) -> np.ndarray:
        """``[end - start]`` bool: which rows this writer staged (StoreDamagedError: a flag chunk
        fails its checksum; a missing one reads "not staged", which is safe)."""
        none = np.zeros(end - start, dtype=bool)  # no row must hold a flag: checksum only
        return checked_read(self.has, (slice(start, end),), none).astype(bool)

    def read_x(self, start: int, end: int, cols: slice, has: np.ndarray) -> np.ndarray:
        """X rows ``[start, end)``, columns ``cols``, checked where ``has`` flags them (the other
        rows are the fill value); StoreDamagedError on a bad chunk or flagged row."""
        return checked_read(self.X, (slice(start, end), cols), has)

    def read_g(self, draw: int, start: int, end: int, cols: slice, has: np.ndarray) -> np.ndarray:
        """Label draw ``draw``'s G rows ``[start, end)``, columns ``cols``, as ``read_x``."""
        return checked_read(self.g_draws[draw], (slice(start, end), cols), has)

    def read_q(self, start: int, end: int, has: np.ndarray) -> np.ndarray | None:
        """Q rows ``[start, end)`` (None without Q), checked where ``has`` flags them."""
        return None if self.Q is None else checked_read(self.Q, (slice(start, end),), has)

    def read_hashes(self, start: int, end: int, has: np.ndarray) -> np.ndarray:
        """H rows ``[start, end)``, checked where ``has`` flags them (see ``read_x``)."""
        return checked_read(self.H, (slice(start, end),), has)


def _g_names(node: zarr.Group) -> list[str]:
    """``G``, ``G1`` … as far as ``node`` holds them (the row set's naming)."""
    names: list[str] = []
    while ("G" if not names else f"G{len(names)}") in node:
        names.append("G" if not names else f"G{len(names)}")
    return names


def staging(rows_group: zarr.Group, create: bool = False) -> zarr.Group | None:
    """The ``staged`` group of a row set (None if absent and not ``create``)."""
    if STAGED in rows_group:
        return group(rows_group, STAGED)
    if not create:
        return None
    try:
        return rows_group.create_group(STAGED)
    except ContainsGroupError:  # another writer created it just now
        return group(rows_group, STAGED)


def shadows(rows_group: zarr.Group) -> list[Shadow]:
    """Every writer's shadow of a row set, skipping ones whose creation was cut short."""
    staged = staging(rows_group)
    if staged is None:
        return []
    with quiet_foreign_nodes():
        names = sorted(staged.group_keys())
    out = []
    for name in names:
        node = group(staged, name)
        if "has" in node:
            out.append(Shadow(node))
    return out
