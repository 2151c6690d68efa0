"""What a store's rows are bound to: the checkpoint (per row set) and the train set (per store).

Both are bound by what was committed (the first commit binds a row set), so a run that fails
before committing a row leaves nothing that refuses the right checkpoint or the fixed data."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import zarr

from trak_dist.errors import StoreMismatchError
from trak_dist.store._commit import CommitFlags
from trak_dist.store._fingerprints import check_unchanged, describe_rows
from trak_dist.store._integrity import store_location
from trak_dist.store._layout import CHECKPOINT

if TYPE_CHECKING:
    from trak_dist.store._rows import RowSet


class CheckpointBinding:
    """The checkpoint fingerprint a row set (``group``, flags ``flags``) is bound to."""

    def __init__(self, group: zarr.Group, flags: CommitFlags) -> None:
        self.group = group
        self.flags = flags
        self._bound_to: str | None = None

    def get(self) -> str | None:
        """The bound fingerprint, or None; read afresh (another process may have bound it
        since this row set was opened)."""
        node = zarr.open_group(self.group.store, path=self.group.path, mode="r")
        value = node.attrs.get(CHECKPOINT)
        return value if isinstance(value, str) else None

    def check(
        self, fingerprint: str | None, what: str | None = None, where: str | None = None
    ) -> None:
        """Raise StoreMismatchError if committed rows come from another checkpoint than
        ``fingerprint`` (a row set with nothing committed takes any); ``what``, ``where``: for
        the message."""
        stored = self.get()
        if not fingerprint or not stored or stored == fingerprint:
            return
        if not self.flags.committed().any():
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
        """Bind to the checkpoint ``fingerprint`` before each commit (StoreMismatchError if
        committed rows come from another). Checked once per object unless ``fresh`` (folds)."""
        if not fingerprint or (self._bound_to == fingerprint and not fresh):
            return
        self.check(fingerprint, what, where)
        if self.get() != fingerprint:
            node = zarr.open_group(self.group.store, path=self.group.path, mode="r+")
            node.attrs[CHECKPOINT] = fingerprint
        self._bound_to = fingerprint


def committed_hashes(rows: RowSet) -> tuple[np.ndarray, np.ndarray]:
    """``([n] bool, [n] uint64)``: which rows are committed, and their item hashes (0 for rows
    not committed: rows a writer wrote but never committed are not bound to anything)."""
    committed = np.repeat(rows.flags.committed(), rows.chunk_rows)[: rows.n]
    return committed, np.where(committed, rows.read_hashes(slice(0, rows.n)), np.uint64(0))


def rebind_dataset(
    root: zarr.Group,
    attr: str,
    requested: dict[str, Any],
    train_sets: list[tuple[int, RowSet]],
    row_hashes: np.ndarray | None,
) -> str | None:
    """Rebind the store (root attribute ``attr``) to ``requested``'s dataset fingerprint when its
    committed train rows allow it; returns the fingerprint it replaced, or None.

    With ``row_hashes`` (the pipeline), only rows not committed yet may differ; without them
    (a user-given fingerprint), only a store with no committed train row is rebound. Call under
    the store lock."""
    meta = root.attrs.get(attr)
    key = "dataset_fingerprint"
    if not isinstance(meta, dict) or meta["spec"].get(key) == requested.get(key):
        return None
    if {k: v for k, v in meta["spec"].items() if k != key} != {
        k: v for k, v in requested.items() if k != key
    }:
        return None
    for _, rows in train_sets:
        committed, stored = committed_hashes(rows)
        if row_hashes is None or len(row_hashes) != rows.n:
            if committed.any():
                return None
        elif (committed & (stored != row_hashes)).any():
            return None  # committed rows changed: refused, naming them (check_rows_unchanged)
    root.attrs[attr] = {**meta, "spec": {**meta["spec"], key: requested[key]}}
    return str(meta["spec"].get(key))


def check_rows_unchanged(
    stored: list[tuple[int, np.ndarray]], requested: np.ndarray, where: str
) -> None:
    """Name the train rows whose stored hashes (``(model_id, [n])`` each) differ from
    ``requested`` (StoreMismatchError); rows never written (hash 0) are skipped."""
    n = len(requested)
    for c, hashes in stored:
        if len(hashes) == n:  # else check_compatible reports the new size
            check_unchanged(hashes, requested, np.arange(n), f"train (model_id={c})", where)


def check_same_items(
    rowsets: list[tuple[int, RowSet]], what: str, where: str, block: int = 1 << 20
) -> None:
    """Raise StoreMismatchError unless every checkpoint's rows hash the same items (read
    ``block`` hashes at a time: memory independent of n)."""
    if len(rowsets) < 2:
        return
    (c0, first), *rest = rowsets
    for r0 in range(0, first.n, block):
        rows = slice(r0, min(first.n, r0 + block))
        ref = first.read_hashes(rows)
        for c, other in rest:
            diff = np.flatnonzero(other.read_hashes(rows) != ref) + r0
            if len(diff):
                raise StoreMismatchError(
                    f"the {what} features of model_id={c} and model_id={c0} in {where} "
                    f"were computed from different items at {describe_rows(diff)}: the data "
                    "changed between checkpoints. Featurise every checkpoint from the same "
                    "data (a new store path, or delete the stale checkpoint's row set)."
                )
