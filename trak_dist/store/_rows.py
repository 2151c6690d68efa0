"""A set of featurised rows in the store: X, optional Q, row hashes H, per-chunk commit flags.

Parts: ``flags`` (``_commit.py``: a chunk counts once its flag is set after its data),
``binding`` (``_binding.py``: the checkpoint bound by the first commit) and ``staged``
(``_fold.py``, ``_staging.py``: TRAKer's partial-chunk rows). Owners of whole chunks ``write``
then ``commit`` them without coordination. Non-finite features are never written: refused,
naming the rows, before anything of a batch is written or staged."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import zarr

from trak_dist.errors import ConfigError, NonFiniteError, StoreMismatchError
from trak_dist.store import _layout as layout
from trak_dist.store._binding import CheckpointBinding
from trak_dist.store._chunk_io import (
    EncodedChunk,
    all_finite,
    encode_rows,
    is_plain,
    one_thread,
    store_chunks,
)
from trak_dist.store._commit import CommitFlags
from trak_dist.store._fold import StagedRows
from trak_dist.store._integrity import checked_read, store_location
from trak_dist.store._zarr import CHECKSUM, array


class RowSet:
    """Rows ``[0, n)`` of projected gradients in ``group``: ``X`` ``[n, p]``, ``H`` ``[n]``
    uint64, ``done`` ``[ceil(n/chunk)]``, optionally ``Q`` ``[n]`` and (train rows of a store
    with ``curvature=fisher``) ``G`` ``[n, p]``, the sampled-label Fisher's rows, chunked and
    committed with X; with D > 1 label draws per row (``fisher_draws``) the further draws are
    ``G1`` … ``G<D-1>``, alike."""

    def __init__(self, group: zarr.Group) -> None:
        self.group = group
        self.X = array(group, "X")
        self.Q = array(group, "Q") if "Q" in group else None
        self.G = array(group, "G") if "G" in group else None
        self.g_draws = [] if self.G is None else [self.G]
        while self.G is not None and f"G{len(self.g_draws)}" in group:
            self.g_draws.append(array(group, f"G{len(self.g_draws)}"))
        if "H" not in group:
            raise StoreMismatchError(
                f"{group.path} in {store_location(group)} holds no row hashes: it was written by "
                "a development version of format 2 (staged rows without checksums). Its rows "
                "cannot be checked; featurise into a new store path (or overwrite this one: "
                "store.overwrite=true, TRAKer(overwrite=True))."
            )
        self.H = array(group, "H")
        self.n, self.proj_dim = self.X.shape
        self.chunk_rows = self.X.chunks[0]
        self.flags = CommitFlags(array(group, "done"), self.n, self.chunk_rows)
        self.binding = CheckpointBinding(group, self.flags)
        self.staged = StagedRows(self)

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
        g_draws: int = 0,
    ) -> RowSet:
        """Lay out an empty row set, with ``g_draws`` arrays of Fisher rows (G, G1, …); X's
        (and G's) chunks are bounded in bytes (``_layout.row_chunks``)."""
        chunks = layout.row_chunks(n, proj_dim, chunk_rows, np.dtype(dtype).itemsize)
        g_names = ["G", *(f"G{d}" for d in range(1, g_draws))] if g_draws else []
        for name in ["X", *g_names]:
            group.create_array(
                name,
                shape=(n, proj_dim),
                chunks=chunks,
                dtype=dtype,
                compressors=compressors,
                fill_value=np.nan,
            )
        rows = chunks[0]
        for name, kind, fill in (("Q", "float32", np.nan), ("H", "uint64", 0)):
            if name == "Q" and not with_q:
                continue
            group.create_array(
                name, shape=(n,), chunks=(rows,), dtype=kind, compressors=CHECKSUM, fill_value=fill
            )
        CommitFlags.create(group, n, rows)
        return cls(group)

    # ---- the commit protocol (``flags``) --------------------------------------------------------
    @property
    def n_chunks(self) -> int:
        return self.flags.n_chunks

    def done_chunks(self) -> np.ndarray:
        """``[n_chunks]`` bool: which chunks are committed (StoreDamagedError: a flag fails its
        checksum; ``store repair`` rewrites it)."""
        return self.flags.committed()

    def is_complete(self) -> bool:
        return bool(self.flags.committed().all())

    def chunk_range(self, start: int, end: int) -> tuple[int, int]:
        """The chunks covering rows ``[start, end)``, which must be chunk-aligned."""
        return self.flags.chunk_range(start, end)

    def pending_ranges(self, max_rows: int) -> Iterator[tuple[int, int]]:
        """Uncommitted rows as chunk-aligned ranges of at most ``max_rows`` (≥ one chunk)."""
        return self.flags.pending_ranges(max_rows)

    def commit(self, start: int, end: int) -> None:
        """Mark the chunks of rows ``[start, end)`` done; call only after their data is written."""
        self.flags.commit(start, end)

    # ---- the checkpoint the rows come from (``binding``) ----------------------------------------
    def checkpoint(self) -> str | None:
        """The fingerprint of the checkpoint this row set is bound to, or None (read afresh)."""
        return self.binding.get()

    def bind(
        self, fingerprint: str | None, what: str | None = None, where: str | None = None
    ) -> None:
        """Bind to the checkpoint ``fingerprint``; call before each commit (``_binding.py``)."""
        self.binding.bind(fingerprint, what, where)

    # ---- rows ----------------------------------------------------------------------------------
    def write(
        self,
        start: int,
        x: np.ndarray,
        q: np.ndarray | None = None,
        h: np.ndarray | None = None,
        g: np.ndarray | None = None,
    ) -> None:
        """Write rows ``[start, start + len(x))``: whole chunks only (see module docstring);
        ``g``, the Fisher's rows (``[B, p]``, or ``[B, D, p]`` for D draws), is required
        exactly when the set holds G."""
        end = start + x.shape[0]
        self.flags.chunk_range(start, end)
        if (g is None) != (self.G is None):
            raise ConfigError(
                f"{self.describe()}: the set {'holds' if self.G is not None else 'has no'} "
                "sampled-label Fisher rows G; write them with X exactly when it does."
            )
        draws = None if g is None else (g[:, None] if g.ndim == 2 else g)
        if draws is not None and draws.shape[1] != len(self.g_draws):
            raise ConfigError(
                f"{self.describe()}: {draws.shape[1]} label draws given; the set holds "
                f"{len(self.g_draws)} (the store's fisher_draws)."
            )
        inds = np.arange(start, end)
        rows = slice(start, end)
        per_draw = [] if draws is None else list(draws.transpose(1, 0, 2))
        # every array's chunks encoded and checked before any is written
        encoded = [self._encoded(self.X, rows, x, inds, q)]
        encoded += [
            self._encoded(a, rows, g_d, inds, None)
            for a, g_d in zip(self.g_draws, per_draw, strict=True)
        ]
        if q is not None and self.Q is not None:
            encoded.append(
                self._encoded(self.Q, rows, q.astype(np.float32, copy=False), None, None)
            )
        if h is not None:
            encoded.append(self._encoded(self.H, rows, h.astype(np.uint64, copy=False), None, None))
        store_chunks(
            self.X, [c for _, chunks in encoded if isinstance(chunks, list) for c in chunks]
        )
        for arr, values in encoded:
            if not isinstance(values, list):  # a compressed array: Zarr encodes it
                _put_columns(arr, rows, values)

    def _encoded(
        self,
        arr: zarr.Array[Any],
        rows: slice,
        values: np.ndarray,
        inds: np.ndarray | None,
        q: np.ndarray | None,
    ) -> tuple[zarr.Array[Any], list[EncodedChunk] | np.ndarray]:
        """``values`` for ``arr[rows]`` as stored: its chunks' bytes (``_chunk_io``) where the
        array is plain, else the values cast (Zarr encodes them); ``inds`` (rows of X or G):
        NonFiniteError before anything is written if a row is not finite as stored."""
        if not is_plain(arr):
            return arr, (values if inds is None else self.stored(inds, values, q))
        if inds is not None:
            self._check_width(values)
        with one_thread():
            chunks = encode_rows(arr, rows, values)
            if inds is not None and not all_finite([c.data for c in chunks], q):
                self.stored(inds, values, q)  # names the rows and raises
        return arr, chunks

    def _check_width(self, x: np.ndarray) -> None:
        if x.shape[1] != self.proj_dim:
            raise ConfigError(f"rows have {x.shape[1]} columns; the store holds {self.proj_dim}.")

    def describe(self) -> str:
        """Whose rows these are, for messages: ``train rows of model_id=0``."""
        return layout.describe(self.group.path)

    def stored(self, inds: np.ndarray, x: np.ndarray, q: np.ndarray | None) -> np.ndarray:
        """``x`` in the store's dtype; NonFiniteError (naming rows ``inds``) before anything of
        it is written or staged if a row is NaN/inf. Only new rows are checked here (``write``,
        ``write_rows``); what is read back (a fold) is checked by ``checked_read``."""
        self._check_width(x)
        with np.errstate(over="ignore"):  # an overflow to inf is refused, with its cause, below
            stored = x.astype(self.X.dtype, copy=False)
        refuse_non_finite_rows(stored, x, q, inds, self.describe())
        return stored

    def put(
        self, rows: slice, x: np.ndarray | None, q: np.ndarray | None, h: np.ndarray | None = None
    ) -> None:
        """Write ``rows`` (whole chunks, checked by the caller) of X, Q and H as given; X one
        column chunk at a time, so Zarr holds one wide chunk in flight, not all of a row's."""
        if x is not None:
            _put_columns(self.X, rows, x.astype(self.X.dtype, copy=False))
        if q is not None and self.Q is not None:
            self.Q[rows] = q.astype(np.float32, copy=False)
        if h is not None:
            self.H[rows] = h.astype(np.uint64, copy=False)

    def put_g(self, rows: slice, g: np.ndarray) -> None:
        """Write ``rows`` (whole chunks, checked by the caller) of every label draw's G from
        ``g`` ``[rows, D, p]``, as ``put`` writes X."""
        for d, arr in enumerate(self.g_draws):
            _put_columns(arr, rows, g[:, d].astype(arr.dtype, copy=False))

    def read(self, start: int, end: int, proj_dim: int | None = None) -> np.ndarray:
        """X rows ``[start, end)`` (the first ``proj_dim`` columns) as stored; raises
        StoreDamagedError for damaged chunks (see ``_integrity.py``)."""
        return self._read_columns(self.X, start, end, proj_dim)

    def read_g(self, start: int, end: int, proj_dim: int | None = None) -> np.ndarray:
        """G rows ``[start, end)`` (the first ``proj_dim`` columns), as ``read``."""
        if self.G is None:
            raise ConfigError(f"{self.describe()} holds no sampled-label Fisher rows G.")
        return self._read_columns(self.G, start, end, proj_dim)

    def _read_columns(
        self, arr: zarr.Array[Any], start: int, end: int, proj_dim: int | None
    ) -> np.ndarray:
        return checked_read(arr, (slice(start, end), slice(0, proj_dim or self.proj_dim)))

    def read_gs(self, start: int, end: int) -> np.ndarray:
        """``[rows, D, p]``: every label draw's G rows ``[start, end)``, as ``read``."""
        if self.G is None:
            raise ConfigError(f"{self.describe()} holds no sampled-label Fisher rows G.")
        return np.stack([self._read_columns(a, start, end, None) for a in self.g_draws], axis=1)

    def read_curvature(self, start: int, end: int) -> np.ndarray:
        """The rows whose Gram is the stored K: G where the set holds it (its D draws as
        :func:`curvature_rows`), else X."""
        if self.G is None:
            return self.read(start, end)
        if len(self.g_draws) == 1:
            return self.read_g(start, end)
        return curvature_rows(self.read_gs(start, end))

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

    def arrays(self) -> list[zarr.Array[Any]]:
        """X, H, (train rows) Q and G where held: the arrays a committed chunk must hold
        whole."""
        extra = [self.Q] if self.Q is not None else []
        return [self.X, self.H, *extra, *self.g_draws]


def curvature_rows(g: np.ndarray) -> np.ndarray:
    """Rows whose Gram is the mean of the D draws' Grams, (1/D) Σ_d G_dᵀ G_d: ``g``
    ``[rows, D, p]`` as stored, stacked to ``[rows·D, p]`` float64 and divided by √D (one
    draw: ``g[:, 0]`` unchanged). The worker's partial K and the store's reduce both use it,
    so they agree exactly."""
    if g.shape[1] == 1:
        return g[:, 0]
    return g.astype(np.float64).reshape(-1, g.shape[2]) / np.sqrt(g.shape[1])


def _put_columns(arr: zarr.Array[Any], rows: slice, values: np.ndarray) -> None:
    """``arr[rows] = values`` one column chunk at a time, so Zarr holds one wide chunk in flight,
    not all of a row's."""
    for cols in layout.column_blocks(arr):
        arr[rows, cols] = values[:, cols]


def refuse_non_finite_rows(
    stored: np.ndarray, raw: np.ndarray, q: np.ndarray | None, rows: np.ndarray, who: str
) -> None:
    """Raise NonFiniteError unless every row is finite as stored, before anything is written;
    ``raw`` (float32 as computed) tells float16 overflow from NaN input, ``q`` ``[B]`` or None,
    ``rows`` the ``[B]`` dataset rows, ``who`` ``RowSet.describe``."""
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
