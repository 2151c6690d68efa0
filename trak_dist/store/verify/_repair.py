"""``trak-dist store repair``: act on ``verify``'s report. Un-commit damaged chunks (their bytes
go too), drop damaged, incomplete or derived reductions and torn nodes, rewrite the flags of
chunks whose data is whole; the next run recomputes exactly what went (see ``_verify.py``)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import zarr
from zarr.core.sync import sync

from trak_dist.store._eval import EvalSet
from trak_dist.store._integrity import delete_chunk
from trak_dist.store._layout import CONTAINERS, EVAL, chunk_coords
from trak_dist.store._lock import store_lock
from trak_dist.store._object_store import open_zarr
from trak_dist.store._rows import RowSet
from trak_dist.store._staging import shadows
from trak_dist.store._tree import Tree
from trak_dist.store._zarr import group
from trak_dist.store.verify._rows import spans
from trak_dist.store.verify._verify import Report, verify


def uncommit_chunks(rows: RowSet, chunks: np.ndarray) -> None:
    """Mark chunks not done, so the next run featurises them again: every row of them, so rows
    of theirs still staged from before their commit are unflagged too (they were never verified
    as part of the chunk). Their bytes go as well: a missing chunk reads as "not written", never
    as data, whoever reads it before the rerun."""
    rows.flags.set(chunks, False)
    for c in np.asarray(chunks, dtype=np.int64).tolist():
        for shadow in shadows(rows.group):
            delete_chunk(shadow.has, (c,))
        for arr in rows.arrays():
            for coords in chunk_coords(arr, c):
                delete_chunk(arr, coords)


def repair(path: str | Path, options: Mapping[str, Any] | None = None) -> tuple[Report, list[str]]:
    """Un-commit damaged chunks and drop damaged, incomplete or derived reductions; returns the
    report it acted on and what it did."""
    where = str(path)
    zstore = open_zarr(where, options)
    base = Tree(zstore)
    with store_lock(where, options=options):
        report = verify(where, options)
        actions: list[str] = []
        uncommit: dict[str, set[int]] = {}
        drops: set[str] = set()
        recommit: dict[str, set[int]] = {}
        for p in report.problems:
            if p.uncommit is not None:
                uncommit.setdefault(p.uncommit[0], set()).add(p.uncommit[1])
            if p.recommit is not None:
                recommit.setdefault(p.recommit[0], set()).add(p.recommit[1])
            drops.update(p.drop)
        # drops first: a torn shadow must be gone before un-committing lists its row set's
        for rel in sorted(drops):
            if any(rel.startswith(d + "/") for d in drops):
                continue  # inside something dropped whole
            parent, _, name = rel.rpartition("/")
            folders, files = sync(base.entries(parent))
            if name in folders or name in files:
                base.remove(rel)
                actions.append(f"dropped {rel}")
        root = zarr.open_group(zstore, mode="r+")
        for rel, chunks in sorted(uncommit.items()):
            if any(rel == d or rel.startswith(d + "/") for d in drops):
                continue  # the whole row set went
            if rel.startswith(f"{EVAL}/"):
                EvalSet(group(root, rel)).uncommit(np.array(sorted(chunks)))
                actions.append(
                    f"un-did {len(chunks)} subset model(s) of {rel} ({sorted(chunks)}): "
                    "`trak-dist eval` trains them again"
                )
                continue
            rows = RowSet(group(root, rel))
            uncommit_chunks(rows, np.array(sorted(chunks)))
            actions.append(
                f"un-committed {len(chunks)} chunk(s) of {rel} (rows {spans(rows, chunks)})"
            )
        for rel, chunks in sorted(recommit.items()):
            if any(rel == d or rel.startswith(d + "/") for d in drops):
                continue
            if rel.startswith(f"{EVAL}/"):
                EvalSet(group(root, rel)).recommit(np.array(sorted(chunks)))
                actions.append(
                    f"rewrote the done flags of {len(chunks)} whole subset model(s) of {rel} "
                    f"({sorted(chunks)})"
                )
                continue
            rows = RowSet(group(root, rel))
            # X is only ever written whole, before its flag: verified whole, it was committed
            rows.flags.set(np.array(sorted(chunks)), True)
            actions.append(
                f"rewrote the commit flags of {len(chunks)} whole chunk(s) of {rel} "
                f"(rows {spans(rows, chunks)})"
            )
        for name in CONTAINERS:
            if name != EVAL:  # made by the first `trak-dist eval`, not with the store
                root.require_group(name)
        for key in report.stray_files:
            sync(zstore.delete(key))
        if report.stray_files:
            actions.append(f"removed {len(report.stray_files)} temporary file(s) of killed writes")
    return report, actions
