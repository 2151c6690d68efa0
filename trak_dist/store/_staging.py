"""Rows staged by one writer: private arrays shaped like the row set, holding only its rows.

traker lets any process fill any rows of a row set (``featurize(batch, inds=…)`` from one process
per shard, boundaries anywhere). Zarr stores whole chunks, so two processes writing rows of one
chunk read-modify-write the same key and one loses the other's rows, silently. A writer therefore
puts rows that do not fill a whole chunk into its own *shadow* arrays under
``staged/<writer>/`` (``X``, ``Q``, ``has``: the same shape and chunking as the row set's, so a
row keeps its index), keys that no other process ever writes. ``RowSet.fold`` merges the shadows
of every writer chunk by chunk and writes a chunk of X only when their union covers it, whole.

Write order: ``X`` and ``Q`` first, the ``has`` flags last. Every key is replaced atomically
(LocalStore writes a temporary file and renames it), so a reader that sees a row's flag also
sees its data, and a writer killed mid-batch leaves rows without flags: not done, recomputed.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import zarr
from zarr.errors import ContainsGroupError

from trak_dist.store._zarr import array, group, quiet_foreign_nodes

STAGED = "staged"


class Shadow:
    """One writer's staged rows of a row set.

    Args:
        node: the group ``staged/<writer>`` holding ``X`` (``[n, p]``), ``has`` (``[n]`` uint8)
            and optionally ``Q`` (``[n]``).
    """

    def __init__(self, node: zarr.Group) -> None:
        self.name = node.basename
        self.X = array(node, "X")
        self.Q = array(node, "Q") if "Q" in node else None
        self.has = array(node, "has")

    @classmethod
    def open_or_create(
        cls, rows_group: zarr.Group, writer: str, like: zarr.Array[Any], with_q: bool
    ) -> Shadow:
        """``writer``'s shadow arrays beside the row set's ``X`` (``like``), created if new."""
        staged = staging(rows_group, create=True)
        assert staged is not None  # created above
        if writer in staged and "has" in group(staged, writer):
            return cls(group(staged, writer))
        # only this writer ever writes these keys, so a shadow half made by an earlier attempt
        # of this process is simply made again (overwrite=True)
        node = staged.require_group(writer)
        n, p = like.shape
        chunk = like.chunks[0]
        node.create_array(
            "X",
            shape=(n, p),
            chunks=(chunk, p),
            dtype=like.dtype,
            compressors=None,
            fill_value=0,
            overwrite=True,
        )
        if with_q:
            node.create_array(
                "Q",
                shape=(n,),
                chunks=(chunk,),
                dtype="float32",
                compressors=None,
                fill_value=0,
                overwrite=True,
            )
        # created last: a shadow without it is a writer killed while creating it, and is skipped
        node.create_array(
            "has",
            shape=(n,),
            chunks=(chunk,),
            dtype="uint8",
            compressors=None,
            fill_value=0,
            overwrite=True,
        )
        return cls(node)

    def write(self, inds: np.ndarray, x: np.ndarray, q: np.ndarray | None) -> None:
        """Stage rows ``inds`` (sorted, unique); their flags are set after their data."""
        self.X.set_orthogonal_selection((inds, slice(None)), x.astype(self.X.dtype, copy=False))
        if q is not None and self.Q is not None:
            self.Q.set_orthogonal_selection(inds, q.astype(np.float32, copy=False))
        self.has.set_orthogonal_selection(inds, np.ones(len(inds), np.uint8))

    def rows(self, start: int, end: int) -> np.ndarray:
        """``[end - start]`` bool: which rows of ``[start, end)`` this writer staged."""
        return np.asarray(self.has[start:end]).astype(bool)

    def read(self, start: int, end: int) -> tuple[np.ndarray, np.ndarray | None]:
        """X (and Q) rows ``[start, end)``; only the rows flagged by ``rows`` are meaningful."""
        q = None if self.Q is None else np.asarray(self.Q[start:end])
        return np.asarray(self.X[start:end]), q


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
