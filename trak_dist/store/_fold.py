"""TRAKer's per-process staging of a row set: any rows, from any process, in any order.

Zarr loses rows when two processes write one chunk, so ``write_rows`` writes (and commits) the
chunks a batch fills whole and stages the other rows in the writer's own shadow arrays
(``_staging.py``); ``fold`` merges every writer's shadows per chunk and commits each chunk
their union covers. Callers fold under the store lock. This keeps the pipeline's lock-free
whole-chunk writes as they are, at the cost of one extra write and read of partial-chunk rows.
A fold moves X column chunk by column chunk, so a wide chunk is never held whole in memory.
Only shadows staged from the checkpoint the row set is bound to are folded or reused."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from trak_dist.errors import ConfigError, StoreMismatchError
from trak_dist.store._fingerprints import describe_rows
from trak_dist.store._integrity import checked_read, store_location
from trak_dist.store._layout import STAGED, column_blocks
from trak_dist.store._staging import Shadow, shadows, staging

if TYPE_CHECKING:
    from trak_dist.store._rows import RowSet


class StagedRows:
    """The staged rows of ``rows`` (one object per RowSet: it remembers this process's shadows)."""

    def __init__(self, rows: RowSet) -> None:
        self.rows = rows
        self._own: dict[str, Shadow] = {}

    def write_rows(
        self,
        inds: np.ndarray,
        x: np.ndarray,
        q: np.ndarray | None = None,
        *,
        h: np.ndarray,
        writer: str,
        checkpoint: str | None = None,
        g: np.ndarray | None = None,
    ) -> np.ndarray:
        """Write rows ``inds``: chunks they fill whole go to X and are committed; the other
        rows are staged in ``writer``'s shadow until ``fold`` finds their chunk complete.

        Args:
            inds: ``[B]`` distinct row indices, any order.
            x: ``[B, p]`` rows.
            q: ``[B]`` out-to-loss weights (train rows only).
            h: ``[B]`` uint64 item hashes (``row_hashes`` of the batch).
            writer: a name no other process shares.
            checkpoint: fingerprint of the rows' checkpoint (binds the row set, marks shadows).
            g: ``[B, D, p]`` the sampled-label Fisher's rows, one per label draw: given exactly
                when the set holds them (train rows, ``curvature=fisher``).

        Returns:
            The chunks that received staged rows: the ones worth folding now.
        """
        rs = self.rows
        if (g is None) != (rs.G is None) or (g is not None and g.shape[1] != len(rs.g_draws)):
            raise ConfigError(
                f"{rs.describe()}: the set holds {len(rs.g_draws)} draws of sampled-label "
                f"Fisher rows G; {0 if g is None else g.shape[1]} given. Write them with X "
                "exactly when it holds them (featurize.curvature=fisher, fisher_draws)."
            )
        inds = self._check_rows(inds, x.shape[0])
        if h.shape != inds.shape:
            raise ConfigError(f"{len(h)} row hashes for a batch of {len(inds)} samples.")
        x = rs.stored(inds, x, q)  # refuses non-finite rows before any is written or staged
        if g is not None:
            g = np.stack([rs.stored(inds, g[:, d], q) for d in range(g.shape[1])], axis=1)
        order = np.argsort(inds, kind="stable")
        inds, x, h = inds[order], x[order], h[order]
        q = None if q is None else q[order]
        g = None if g is None else g[order]
        # bound before anything is written: a row set stays bound to one checkpoint, and the
        # binder of a set whose rows are all staged tells a later fold which shadows to use
        rs.binding.bind(checkpoint)
        chunk = inds // rs.chunk_rows
        staged = np.ones(len(inds), dtype=bool)
        firsts, counts = np.unique(chunk, return_index=True, return_counts=True)[1:]
        for f, k in zip(firsts, counts, strict=True):
            start = int(chunk[f]) * rs.chunk_rows
            if k == min(rs.n, start + rs.chunk_rows) - start:  # sorted, distinct: the chunk
                part = slice(f, f + k)
                rows = slice(start, start + k)
                rs.put(rows, x[part], None if q is None else q[part], h[part])
                if g is not None:
                    rs.put_g(rows, g[part])
                rs.flags.commit(start, start + k)
                staged[part] = False
        if staged.any():
            shadow = self._own.get(writer)
            if shadow is None or shadow.checkpoint != checkpoint:
                shadow = self._own[writer] = Shadow.open_or_create(
                    rs.group, writer, rs.X, rs.Q is not None, checkpoint, len(rs.g_draws)
                )
            shadow.write(
                inds[staged],
                x[staged],
                None if q is None else q[staged],
                h[staged],
                None if g is None else g[staged],
            )
        return np.unique(chunk[staged])

    def _check_rows(self, inds: np.ndarray, batch: int) -> np.ndarray:
        n = self.rows.n
        inds = np.asarray(inds).reshape(-1)
        if inds.dtype.kind not in "iu":
            raise ConfigError(f"row indices must be integers; got dtype {inds.dtype}.")
        inds = inds.astype(np.int64)
        if len(inds) != batch:
            raise ConfigError(f"{len(inds)} row indices for a batch of {batch} samples.")
        if len(inds) and (inds.min() < 0 or inds.max() >= n):
            raise ConfigError(
                f"row indices span [{inds.min()}, {inds.max()}]; this set has rows [0, {n})."
            )
        if len(np.unique(inds)) != len(inds):
            raise ConfigError("row indices of one batch repeat; each sample needs its own row.")
        return inds

    def shadows(self, checkpoint: str | None = None) -> list[Shadow]:
        """The writers' shadows staged from ``checkpoint`` (default: the one the row set is
        bound to). Shadows of another checkpoint are never folded nor reused."""
        want = self.rows.binding.get() if checkpoint is None else checkpoint
        return [w for w in shadows(self.rows.group) if w.checkpoint == want]

    def staged_rows(self, checkpoint: str | None = None) -> np.ndarray:
        """``[n]`` bool: rows staged from ``checkpoint`` (default: the bound one) by any writer
        and not folded yet."""
        out = np.zeros(self.rows.n, dtype=bool)
        for shadow in self.shadows(checkpoint):
            out |= shadow.rows(0, self.rows.n)
        return out

    def rows_done(self, checkpoint: str | None = None) -> np.ndarray:
        """``[n]`` bool: rows committed in X or staged from ``checkpoint`` (default: the bound
        one) by any writer: nobody needs to redo them."""
        rs = self.rows
        committed = np.repeat(rs.flags.committed(), rs.chunk_rows)[: rs.n]
        return committed | self.staged_rows(checkpoint)

    def recorded_hashes(self, inds: np.ndarray, checkpoint: str | None = None) -> np.ndarray:
        """``[B]`` uint64: the item hashes rows ``inds`` were featurised from, committed or
        staged from ``checkpoint`` (default: the bound one; the shadow a fold would take); 0
        for rows neither committed nor staged. Reads are checked (StoreDamagedError)."""
        rs = self.rows
        inds = np.asarray(inds, dtype=np.int64)
        out = np.zeros(len(inds), dtype=np.uint64)
        done = rs.flags.committed()
        writers: list[Shadow] | None = None
        for c in np.unique(inds // rs.chunk_rows).tolist():
            start, end = rs.flags.span(c)
            mine = (inds >= start) & (inds < end)
            local = inds[mine] - start
            if done[c]:
                want = np.zeros(end - start, dtype=bool)
                want[local] = True
                out[mine] = checked_read(rs.H, (slice(start, end),), want)[local]
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

        Call under the store lock. Only rows staged from ``checkpoint`` (default: the bound one)
        are used. A full fold that commits every chunk removes the staging area.

        Returns:
            The number of chunks committed.

        Raises:
            StoreDamagedError: a staged chunk a fold needs is damaged (see ``store repair``).
            StoreMismatchError: committed rows come from another checkpoint, or two writers
                staged one row from different items.
        """
        rs = self.rows
        if chunks is None:
            todo = np.flatnonzero(~rs.flags.committed())
        else:
            todo = np.unique(np.asarray(chunks, dtype=np.int64))
            todo = todo[~rs.flags.of(todo)]
        writers = self.shadows(checkpoint) if len(todo) else []
        committed = 0
        for c in todo.tolist():
            start, end = rs.flags.span(c)
            parts = [(w, has) for w in writers if (has := w.rows(start, end)).any()]
            if not np.logical_or.reduce([has for _, has in parts], initial=False).all():
                continue
            q = None if rs.Q is None else np.full(end - start, np.nan, dtype=np.float32)
            h = np.zeros(end - start, dtype=np.uint64)
            for w, has in parts:
                hw = w.read_hashes(start, end, has)
                clash = has & (h != 0) & (h != hw)
                if clash.any():
                    raise StoreMismatchError(
                        f"{rs.group.path} in {store_location(rs.group)}: "
                        f"{describe_rows(np.flatnonzero(clash) + start)}: staged by two "
                        "processes from different items (the data differs between them). Give "
                        "every process the same data, and start afresh (a new store path, or "
                        "TRAKer(overwrite=True))."
                    )
                h[has] = hw[has]
                qw = w.read_q(start, end, has)
                if q is not None and qw is not None:
                    q[has] = qw[has]
            if checkpoint is not None and committed == 0:
                rs.binding.bind(checkpoint, fresh=True)  # as a direct commit binds; read afresh
            for cols in column_blocks(rs.X):  # one column chunk in memory at a time
                x = np.full((end - start, cols.stop - cols.start), np.nan, dtype=rs.X.dtype)
                for w, has in parts:
                    x[has] = w.read_x(start, end, cols, has)[has]
                rs.X[start:end, cols] = x  # read checked: finite; whole chunks
            for d, arr in enumerate(rs.g_draws):  # the Fisher's rows, alike
                for cols in column_blocks(arr):
                    g = np.full((end - start, cols.stop - cols.start), np.nan, dtype=arr.dtype)
                    for w, has in parts:
                        g[has] = w.read_g(d, start, end, cols, has)[has]
                    arr[start:end, cols] = g
            rs.put(slice(start, end), None, q, h)
            rs.flags.commit(start, end)
            committed += 1
        if chunks is None and committed == len(todo) and staging(rs.group) is not None:
            del rs.group[STAGED]  # every row is in X now; shadows are garbage
            self._own.clear()
        return committed
