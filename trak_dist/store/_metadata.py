"""Metadata a store is opened with: every ``zarr.json`` of a local store must parse (a row set's
metadata holds its checkpoint); ``trak-dist store repair`` drops what torn files describe."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from trak_dist.errors import StoreStateError
from trak_dist.store._layout import CONTAINERS, EVAL, ROW_GROUPS

# how long a node's metadata may be half written by another process before it counts as torn
SETTLE_LOOKS = 4
SETTLE_S = 0.25


def settled_unreadable(where: str) -> list[str]:
    """:func:`unreadable_metadata`, less nodes another process is creating right now (Zarr
    writes a folder before its ``zarr.json``, non-atomically): only what stays unreadable for
    about a second is reported."""
    bad = set(unreadable_metadata(where))
    for _ in range(SETTLE_LOOKS):
        if not bad:
            break
        time.sleep(SETTLE_S)
        bad &= set(unreadable_metadata(where))
    return sorted(bad)


def check_metadata(where: str) -> None:
    """Raise StoreStateError naming every unreadable ``zarr.json`` of a local store."""
    base = Path(where)
    if "://" in where or not base.is_dir():
        return
    if not (base / "zarr.json").exists() and not any((base / c).exists() for c in ROW_GROUPS):
        return  # no store here yet (a traker save_dir may hold a "scores" folder of its own)
    bad = settled_unreadable(where)
    if not bad:
        return
    if "" in bad:
        raise StoreStateError(
            f"the store's root metadata {Path(where) / 'zarr.json'} is unreadable (cut short, "
            "missing or not Zarr JSON). It holds the store's settings, which cannot be rebuilt: "
            "featurise into a new store path (or overwrite this one: store.overwrite=true, "
            "TRAKer(overwrite=True))."
        )
    files = ", ".join(str(Path(where) / b / "zarr.json") for b in bad)
    raise StoreStateError(
        f"unreadable metadata in the store at {where}: {files} (cut short, missing or not "
        f"Zarr JSON). Run `trak-dist store repair {where}`: it drops what these files "
        "describe, and the next run recomputes it."
    )


def unreadable_metadata(root: str | Path) -> list[str]:
    """Node paths (``""``: root) whose ``zarr.json`` is missing, cut short or not Zarr v3.
    Chunk folders and foreign folders (a traker ``save_dir``) are skipped; ``eval/`` only when
    it has metadata of its own."""
    base = Path(root)
    bad: list[str] = []
    for dirpath, dirnames, filenames in os.walk(base):
        rel = Path(dirpath).relative_to(base).as_posix()
        rel = "" if rel == "." else rel
        node_type = _node_type(Path(dirpath) / "zarr.json") if "zarr.json" in filenames else None
        if node_type is None:
            bad.append(rel)
        if rel == "":
            dirnames[:] = [
                d
                for d in dirnames
                if d in CONTAINERS and (d != EVAL or (Path(dirpath) / d / "zarr.json").exists())
            ]
        elif node_type != "group":
            # an array's chunks (or a node we cannot read): nothing below is metadata we own
            dirnames[:] = [d for d in dirnames if d != "c"] if node_type is None else []
        dirnames.sort()
    return bad


def _node_type(path: Path) -> str | None:
    try:
        meta = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    if not isinstance(meta, dict) or meta.get("zarr_format") != 3:
        return None
    kind = meta.get("node_type")
    return kind if kind in ("group", "array") else None
