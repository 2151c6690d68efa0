"""A score set's place on disk or in a group: its empty arrays (``lay_out``) and the removal of
unfinished and replaced sets (``remove_leftovers``, ``discard_set``, ``remove_dir``), which on a
local store only the file system can do (a folder whose zarr.json never got written)."""

from __future__ import annotations

import asyncio
import errno
import logging
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import zarr
from zarr.storage import LocalStore

from trak_dist.store._layout import OLD, PARTIAL, TOPK_ARRAYS
from trak_dist.store._zarr import CHECKSUM

logger = logging.getLogger(__name__)
# how long a failed set's folder must stay away before it counts as removed: zarr writes from
# I/O threads that can outlive the exception which ended the write, and each write makes its
# parent folders first, so a removed folder can come back (1 in ~200 full-disk failures here),
# usually within ms, once more than 0.5 s later on a loaded machine; REMOVE_MAX_S bounds the wait
REMOVE_SETTLE_S = 0.5
REMOVE_MAX_S = 10.0


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


def drain_zarr_io(timeout: float = REMOVE_MAX_S) -> None:
    """Wait (at most ``timeout``) for the tasks still running on zarr's I/O loop: a write that
    failed inside a gather leaves its sibling writes running, and each makes its parent folders
    again. zarr keeps the loop in ``zarr.core.sync.loop``, which is not public API: without
    it (another zarr version), or on that loop's own thread, nothing is waited for."""
    try:
        from zarr.core import sync as zsync
    except ImportError:
        return
    running = getattr(zsync, "loop", [None])[0]
    thread = getattr(zsync, "iothread", [None])[0]
    if running is None or not running.is_running() or thread is threading.current_thread():
        return

    async def others_done() -> None:
        me = asyncio.current_task()
        others = [t for t in asyncio.all_tasks() if t is not me]
        if others:
            await asyncio.wait(others, timeout=timeout)

    try:
        asyncio.run_coroutine_threadsafe(others_done(), running).result(timeout + 1)
    except Exception as e:  # a timeout, or a loop closing: the settle loop below still runs
        logger.debug("zarr's I/O did not settle: %r", e)


def remove_dir(path: Path) -> None:
    """Remove a failed set's folder (best effort: the disk may be full; a failure is logged,
    never raised over the error that failed the set): once zarr's writes still in flight are
    done (``drain_zarr_io``), and again whenever a lagging one recreates it, until it has stayed
    away for REMOVE_SETTLE_S (at most REMOVE_MAX_S)."""
    drain_zarr_io()
    start = quiet_since = time.monotonic()
    while True:
        try:
            shutil.rmtree(path)
            quiet_since = time.monotonic()  # it was there: a lagging write may bring it back
        except FileNotFoundError:
            pass  # gone already, or never made
        except OSError as e:
            # ENOTEMPTY: a lagging write added a file while the folder was emptied; try again
            if e.errno != errno.ENOTEMPTY or time.monotonic() - start >= REMOVE_MAX_S:
                logger.warning("could not remove the partial scores %s: %s", path, e)
                return
            quiet_since = time.monotonic()
        now = time.monotonic()
        if now - quiet_since >= REMOVE_SETTLE_S:
            return
        if now - start >= REMOVE_MAX_S:
            logger.warning("the partial scores %s kept coming back; left for the next run", path)
            return
        time.sleep(0.05)
