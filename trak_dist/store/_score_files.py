"""A score set's place on disk or in a group: its empty arrays (``lay_out``) and the removal of
unfinished and replaced sets (``remove_leftovers``, ``discard_set``, ``remove_dir``), which on a
local store only the file system can do (a folder whose zarr.json never got written)."""

from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import zarr
from zarr.storage import LocalStore

from trak_dist.store._codecs import CHECKSUM
from trak_dist.store._layout import OLD, PARTIAL, TOPK_ARRAYS

logger = logging.getLogger(__name__)
# how long a failed set's folder is kept being removed: zarr writes from I/O threads that can
# outlive the exception which ended the write, and each write makes its parent folders first,
# so a removed folder can come back (1 in ~200 full-disk failures here) for a few ms
REMOVE_SETTLE_S = 0.5


def local_dir(node: zarr.Group) -> Path | None:
    """The folder of ``node`` in a local store; None in an object store."""
    store = node.store_path.store
    return Path(store.root) / node.path if isinstance(store, LocalStore) else None


def lay_out(
    group: zarr.Group,
    n: int,
    m: int,
    topk: int,
    chunk_rows: int,
    attrs: dict[str, Any],
    full: bool = True,
    chunk_cols: int = 1024,
) -> None:
    """The empty arrays of a score set (S unless not ``full``, and the top-k per target),
    marked incomplete."""
    group.attrs.update({**attrs, "n": int(n), "m": int(m), "topk": int(topk), "complete": False})
    if full:
        group.create_array(
            "S",
            shape=(n, m),
            chunks=(min(n, chunk_rows), min(m, chunk_cols)),
            dtype="float32",
            compressors=CHECKSUM,
            fill_value=np.nan,
        )
    k = min(topk, n)
    for key in TOPK_ARRAYS:
        idx = key.endswith("idx")
        group.create_array(
            key,
            shape=(m, k),
            chunks=(min(m, 4096), max(k, 1)),
            dtype="int64" if idx else "float32",
            compressors=CHECKSUM,
            fill_value=-1 if idx else np.nan,
        )


def remove_leftovers(parent: zarr.Group, base: Path | None, name: str) -> None:
    """Remove a killed scoring's partial and old sets of ``name`` (one scorer per variant at a
    time); on disk, also a folder whose zarr.json never got written."""
    keys = [p.name for p in base.iterdir()] if base is not None else list(parent.group_keys())
    for key in keys:
        if key.startswith(name + PARTIAL) or key.startswith(name + OLD):
            if base is not None:
                shutil.rmtree(base / key)
            else:
                del parent[key]


def discard_set(parent: zarr.Group | None, group: zarr.Group, name: str) -> None:
    if parent is None or group.basename == name:
        return
    base = local_dir(parent)
    if base is not None:
        remove_dir(base / group.basename)
        return
    try:
        del parent[group.basename]
    except OSError as e:
        logger.warning("could not remove the partial scores %s: %s", group.path, e)


def remove_dir(path: Path) -> None:
    """Remove a failed set's folder (best effort: the disk may be full; a failure is logged,
    never raised over the error that failed the set), and again for REMOVE_SETTLE_S while
    zarr's lagging I/O threads may recreate it."""
    deadline = time.monotonic() + REMOVE_SETTLE_S
    while True:
        try:
            shutil.rmtree(path)
        except FileNotFoundError:
            pass  # gone already, or never made
        except OSError as e:
            logger.warning("could not remove the partial scores %s: %s", path, e)
            return
        if time.monotonic() >= deadline:
            return
        time.sleep(0.05)
