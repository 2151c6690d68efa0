"""A set of featurised rows in the store: X, optional Q, row hashes H, per-chunk commit flags,
staged rows.

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

Integrity (store/_integrity.py): X, Q and H chunks, committed or staged, carry a crc32c and a
fill value written rows never hold (NaN, NaN, 0), so reads name damaged or missing chunks. H
holds a 64-bit hash of each row's train/target item, written with the row (store/_hashes.py);
a staged row carries its hash in its shadow and a fold moves X, Q and H together. A row set is
bound to the checkpoint that commits its first chunk, whether a writer commits a whole chunk or
a fold does (``bind``); only shadows staged from that checkpoint are folded or reused.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import zarr

from trak_dist.errors import ConfigError, NonFiniteError, StoreDamagedError, StoreMismatchError
from trak_dist.store._codecs import CHECKSUM
from trak_dist.store._hashes import describe_rows
from trak_dist.store._integrity import checked_read, delete_chunk, store_location
from trak_dist.store._staging import CHECKPOINT, STAGED, Shadow, shadows, staging
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
        if "H" not in group:
            raise StoreMismatchError(
                f"{group.path} in {store_location(group)} holds no row hashes: it was written by "
                "a development version of format 2 (staged rows without checksums). Its rows "
                "cannot be checked; featurise into a new store path (or overwrite this one: "
                "store.overwrite=true, TRAKer(overwrite=True))."
            )
        self.H = array(group, "H")
        self._done = array(group, "done")
        self.n, self.proj_dim = self.X.shape
        self.chunk_rows = self.X.chunks[0]
        self._own: dict[str, Shadow] = {}
        self._bound_to: str | None = None

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
            "done",
            shape=(n_chunks,),
            chunks=(1,),
            dtype="uint8",
            compressors=CHECKSUM,
            fill_value=0,
        )
        return cls(group)

    @property
    def n_chunks(self) -> int:
        return int(self._done.shape[0])

    def done_chunks(self) -> np.ndarray:
        """``[n_chunks]`` bool: which chunks are committed.

        Raises:
            StoreDamagedError: a flag fails its checksum (``store repair`` rewrites it).
        """
        no_row_needs_a_flag = np.zeros(self.n_chunks, dtype=bool)  # 0 (absent) means not done
        return checked_read(self._done, (slice(0, self.n_chunks),), no_row_needs_a_flag) != 0

    def commit_flags(self) -> tuple[np.ndarray, np.ndarray]:
        """``([n_chunks], [n_chunks])`` bool: committed chunks, and chunks whose flag cannot be
        read (``store verify``: their data decides whether they are committed)."""
        unreadable = np.zeros(self.n_chunks, dtype=bool)
        try:
            return self.done_chunks(), unreadable
        except StoreDamagedError as e:
            for d in e.damage:
                unreadable[d.chunk[0]] = True  # type: ignore[attr-defined]
        done = np.zeros(self.n_chunks, dtype=bool)
        for c in np.flatnonzero(~unreadable).tolist():
            done[c] = bool(np.asarray(self._done[c : c + 1])[0])
        return done, unreadable

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
        self._write(slice(start, end), self._stored(np.arange(start, end), x, q), q, h)

    def describe(self) -> str:
        """Whose rows these are, for messages: ``train rows of model_id=0``."""
        parts = self.group.path.strip("/").split("/")
        if parts[0] == "train" and len(parts) == 2:
            return f"train rows of model_id={parts[1]}"
        if parts[0] == "targets" and len(parts) == 3:
            return f"target rows of experiment {parts[1]!r}, model_id={parts[2]}"
        return f"rows of {self.group.path}"

    def _stored(self, inds: np.ndarray, x: np.ndarray, q: np.ndarray | None) -> np.ndarray:
        """``x`` in the store's dtype; NonFiniteError (naming rows ``inds``) before anything of
        it is written or staged if a row is NaN/inf. Only new rows are checked here (``write``,
        ``write_rows``); what is read back (a fold) is checked by ``checked_read``."""
        if x.shape[1] != self.proj_dim:
            raise ConfigError(f"rows have {x.shape[1]} columns; the store holds {self.proj_dim}.")
        with np.errstate(over="ignore"):  # an overflow to inf is refused, with its cause, below
            stored = x.astype(self.X.dtype, copy=False)
        refuse_non_finite(stored, x, q, inds, self.describe())
        return stored

    def _write(
        self, rows: slice, x: np.ndarray, q: np.ndarray | None, h: np.ndarray | None = None
    ) -> None:
        self.X[rows] = x.astype(self.X.dtype, copy=False)
        if q is not None and self.Q is not None:
            self.Q[rows] = q.astype(np.float32, copy=False)
        if h is not None:
            self.H[rows] = h.astype(np.uint64, copy=False)

    def commit(self, start: int, end: int) -> None:
        """Mark the chunks of rows ``[start, end)`` done; call only after their data is written."""
        c0, c1 = self.chunk_range(start, end)
        self._done[c0:c1] = 1

    # ---- the checkpoint the rows come from -----------------------------------------------------
    def checkpoint(self) -> str | None:
        """The fingerprint of the checkpoint this row set is bound to, or None; read afresh
        (another process may have bound it since this RowSet was opened)."""
        node = zarr.open_group(self.group.store, path=self.group.path, mode="r")
        value = node.attrs.get(CHECKPOINT)
        return value if isinstance(value, str) else None

    def check_bound(
        self, fingerprint: str | None, what: str | None = None, where: str | None = None
    ) -> None:
        """Raise StoreMismatchError if committed rows come from another checkpoint than
        ``fingerprint``. Bound by a run that committed nothing, a row set takes any checkpoint.

        Args:
            what, where: the row set and the store, for the message.
        """
        stored = self.checkpoint()
        if not fingerprint or not stored or stored == fingerprint:
            return
        if not self.done_chunks().any():
            return  # bound by a run that committed nothing: the next commit rebinds it
        raise StoreMismatchError(
            f"{what or self.group.path} in {where or store_location(self.group)} was featurised "
            f"from a different checkpoint (fingerprint {stored}, now {fingerprint}). Give each "
            "checkpoint its own model_id, or use a new store path."
        )

    def bind(
        self,
        fingerprint: str | None,
        what: str | None = None,
        where: str | None = None,
        *,
        fresh: bool = False,
    ) -> None:
        """Bind the row set to the checkpoint ``fingerprint``; call before each commit.

        A row set is bound by its first committed chunk, not when it is created: a run that
        failed before committing anything (a wrong checkpoint) leaves nothing that refuses the
        right one. Checked once per RowSet unless ``fresh`` (folds, under the store lock).

        Raises:
            StoreMismatchError: committed rows come from another checkpoint.
        """
        if not fingerprint or (self._bound_to == fingerprint and not fresh):
            return
        self.check_bound(fingerprint, what, where)
        if self.checkpoint() != fingerprint:
            node = zarr.open_group(self.group.store, path=self.group.path, mode="r+")
            node.attrs[CHECKPOINT] = fingerprint
        self._bound_to = fingerprint

    # ---- any rows, from any process, in any order (traker's API) -------------------------------
    def write_rows(
        self,
        inds: np.ndarray,
        x: np.ndarray,
        q: np.ndarray | None = None,
        *,
        h: np.ndarray,
        writer: str,
        checkpoint: str | None = None,
    ) -> np.ndarray:
        """Write rows ``inds``: the chunks they fill whole go to X and are committed; the other
        rows are staged in ``writer``'s shadow until ``fold`` finds their chunk complete.

        Args:
            inds: ``[B]`` distinct row indices, any order.
            x: ``[B, p]`` rows.
            q: ``[B]`` out-to-loss weights (train rows only).
            h: ``[B]`` uint64 item hashes (``row_hashes`` of the batch).
            writer: a name no other process shares (e.g. a random hex string); one process
                may reuse it for any number of calls.
            checkpoint: the fingerprint of the checkpoint the rows come from; the row set is
                bound to it (see ``bind``) and the staged rows are marked with it.

        Returns:
            The chunks that received staged rows: the ones worth folding now.
        """
        inds = self._check_rows(inds, x.shape[0])
        if h.shape != inds.shape:
            raise ConfigError(f"{len(h)} row hashes for a batch of {len(inds)} samples.")
        self._stored(inds, x, q)  # refuses non-finite rows before any is written or staged
        order = np.argsort(inds, kind="stable")
        inds, x, h = inds[order], x[order], h[order]
        q = None if q is None else q[order]
        # bound before anything is written: a row set stays bound to one checkpoint, and the
        # binder of a set whose rows are all staged tells a later fold which shadows to use
        self.bind(checkpoint)
        chunk = inds // self.chunk_rows
        staged = np.ones(len(inds), dtype=bool)
        firsts, counts = np.unique(chunk, return_index=True, return_counts=True)[1:]
        for f, k in zip(firsts, counts, strict=True):
            start = int(chunk[f]) * self.chunk_rows
            if k == min(self.n, start + self.chunk_rows) - start:  # sorted, distinct: the chunk
                rows = slice(f, f + k)
                # checked above (_stored), with the whole batch
                self._write(
                    slice(start, start + k), x[rows], None if q is None else q[rows], h[rows]
                )
                self.commit(start, start + k)
                staged[rows] = False
        if staged.any():
            shadow = self._own.get(writer)
            if shadow is None or shadow.checkpoint != checkpoint:
                shadow = self._own[writer] = Shadow.open_or_create(
                    self.group, writer, self.X, self.Q is not None, checkpoint
                )
            shadow.write(inds[staged], x[staged], None if q is None else q[staged], h[staged])
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

    def shadows(self, checkpoint: str | None = None) -> list[Shadow]:
        """The writers' shadows staged from ``checkpoint`` (default: the one the row set is
        bound to). Shadows of another checkpoint are never folded nor reused."""
        want = self.checkpoint() if checkpoint is None else checkpoint
        return [w for w in shadows(self.group) if w.checkpoint == want]

    def staged_rows(self, checkpoint: str | None = None) -> np.ndarray:
        """``[n]`` bool: rows staged from ``checkpoint`` (default: the bound one) by any writer
        and not folded yet."""
        out = np.zeros(self.n, dtype=bool)
        for shadow in self.shadows(checkpoint):
            out |= shadow.rows(0, self.n)
        return out

    def rows_done(self, checkpoint: str | None = None) -> np.ndarray:
        """``[n]`` bool: rows committed in X or staged from ``checkpoint`` (default: the bound
        one) by any writer: nobody needs to redo them."""
        committed = np.repeat(self.done_chunks(), self.chunk_rows)[: self.n]
        return committed | self.staged_rows(checkpoint)

    def recorded_hashes(self, inds: np.ndarray, checkpoint: str | None = None) -> np.ndarray:
        """``[B]`` uint64: the item hashes rows ``inds`` were featurised from, committed or
        staged from ``checkpoint`` (default: the bound one; the shadow a fold would take); 0
        for rows neither committed nor staged. Reads are checked (StoreDamagedError)."""
        inds = np.asarray(inds, dtype=np.int64)
        out = np.zeros(len(inds), dtype=np.uint64)
        done = self.done_chunks()
        writers: list[Shadow] | None = None
        for c in np.unique(inds // self.chunk_rows).tolist():
            start, end = c * self.chunk_rows, min(self.n, (c + 1) * self.chunk_rows)
            mine = (inds >= start) & (inds < end)
            local = inds[mine] - start
            if done[c]:
                want = np.zeros(end - start, dtype=bool)
                want[local] = True
                out[mine] = checked_read(self.H, (slice(start, end),), want)[local]
                continue
            writers = self.shadows(checkpoint) if writers is None else writers
            found = np.zeros(len(local), dtype=np.uint64)
            for w in writers:  # later writers win, as in fold
                has = w.rows(start, end)
                if has[local].any():
                    hw = w.read_hashes(start, end, has)
                    found = np.where(has[local], hw[local], found)
            out[mine] = found
        return out

    def fold(self, chunks: np.ndarray | None = None, checkpoint: str | None = None) -> int:
        """Write and commit every chunk (of ``chunks``; default: all) that staged rows cover.

        Call under the store lock. Only rows staged from ``checkpoint`` are used (default: the
        checkpoint the row set is bound to; given, the row set is bound to it first, as a
        direct commit binds). X, Q and H move together, read checked. A full fold that leaves
        every chunk committed removes the staging area.

        Returns:
            The number of chunks committed.

        Raises:
            StoreDamagedError: a staged chunk that a fold needs is damaged (``store repair``
                drops that writer's shadow; its rows are then featurised again).
            StoreMismatchError: committed rows come from another checkpoint, or two writers
                staged one row from different items.
        """
        if chunks is None:
            todo = np.flatnonzero(~self.done_chunks())
        else:
            todo = np.unique(np.asarray(chunks, dtype=np.int64))
            try:  # just these flags: a fold follows every TRAKer batch
                flags = np.asarray(self._done.get_orthogonal_selection(todo))
            except ValueError:  # a flag fails its checksum: name it
                flags = self.done_chunks()[todo]
            todo = todo[flags == 0]
        writers = self.shadows(checkpoint) if len(todo) else []
        committed = 0
        for c in todo:
            start, end = int(c) * self.chunk_rows, min(self.n, (int(c) + 1) * self.chunk_rows)
            parts = [(w, w.rows(start, end)) for w in writers]
            if not np.logical_or.reduce([has for _, has in parts], initial=False).all():
                continue
            x = np.full((end - start, self.proj_dim), np.nan, dtype=self.X.dtype)
            q = None if self.Q is None else np.full(end - start, np.nan, dtype=np.float32)
            h = np.zeros(end - start, dtype=np.uint64)
            for w, has in parts:
                if has.any():
                    xw, qw, hw = w.read(start, end, has)
                    clash = has & (h != 0) & (h != hw)
                    if clash.any():
                        raise StoreMismatchError(
                            f"{self.group.path} in {store_location(self.group)}: "
                            f"{describe_rows(np.flatnonzero(clash) + start)}: staged by two "
                            "processes from different items (the data differs between them). "
                            "Give every process the same data, and start afresh (a new store "
                            "path, or TRAKer(overwrite=True))."
                        )
                    x[has], h[has] = xw[has], hw[has]
                    if q is not None and qw is not None:
                        q[has] = qw[has]
            if checkpoint is not None and committed == 0:
                self.bind(checkpoint, fresh=True)  # as a direct commit binds; read afresh
            self._write(slice(start, end), x, q, h)  # read checked: finite, whole chunk
            self.commit(start, end)
            committed += 1
        if chunks is None and committed == len(todo) and staging(self.group) is not None:
            del self.group[STAGED]  # every row is in X now; shadows are garbage
            self._own.clear()
        return committed

    def uncommit_chunks(self, chunks: np.ndarray) -> None:
        """Mark chunks not done (``store repair``), so the next run featurises them again: every
        row of them, so rows of theirs still staged from before their commit are unflagged too
        (they were never verified as part of the chunk)."""
        for c in np.asarray(chunks, dtype=np.int64).tolist():
            self._done[c : c + 1] = 0
            for shadow in shadows(self.group):
                delete_chunk(shadow.has, (c,))

    def recommit_chunks(self, chunks: np.ndarray) -> None:
        """Rewrite the flags of chunks whose data was verified whole (``store repair`` of an
        unreadable flag: X is only ever written whole, before its flag)."""
        for c in np.asarray(chunks, dtype=np.int64).tolist():
            self._done[c : c + 1] = 1

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
