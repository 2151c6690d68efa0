"""One process at a time creates or featurises a store (``<store>.lock`` beside it): parallel
jobs on one store would otherwise race to create it or rewrite factors under readers."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path

from filelock import FileLock, Timeout

logger = logging.getLogger(__name__)


@contextlib.contextmanager
def store_lock(path: str | Path, wait: bool = True) -> Iterator[bool]:
    """Hold the inter-process lock of the local store at ``path`` (re-entrant); none for URLs.

    Args:
        path: the store.
        wait: block until free; with False, yield False at once when another process holds it
            (for skippable work such as folding staged rows).

    Yields:
        Whether the caller may go ahead (always True when ``wait``).
    """
    where = str(path)
    if "://" in where:
        if wait:
            logger.warning(
                "no lock for the remote store %s: run one featurising job at a time", where
            )
        yield wait
        return
    lock_file = Path(f"{Path(where).resolve()}.lock")
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(lock_file, is_singleton=True)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        if not wait:
            yield False
            return
        logger.warning("waiting for another trak-dist process using %s (%s)", where, lock.lock_file)
        lock.acquire()
    try:
        yield True
    finally:
        lock.release()
