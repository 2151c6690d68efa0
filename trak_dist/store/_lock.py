"""One process at a time creates or featurises a store (``<store>.lock`` beside it): parallel
jobs on one store would otherwise race to create it or rewrite factors under readers. One
process at a time prepares and finishes each scoring variant (``ScoringLease``,
``<store>.scoring-<exp>-<variant>.lock``)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path

from filelock import FileLock, Timeout

from trak_dist.errors import StoreStateError

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


class ScoringLease:
    """One variant's scoring of a local store, held by the process that prepares it until it
    publishes or gives up (``release``); the OS drops it with a killed process. A second
    scoring of the variant meanwhile would resume the same unfinished set, or remove it
    (another plan), under the first: it fails at once instead."""

    def __init__(self, path: str | Path, exp: str, variant: str) -> None:
        self.lock_file = Path(f"{Path(path).resolve()}.scoring-{exp}-{variant}.lock")
        # not a singleton: a second scoring in this same process is refused as well
        self._lock = FileLock(self.lock_file)
        try:
            self._lock.acquire(timeout=0)
        except Timeout:
            raise StoreStateError(
                f"another process is scoring {variant!r} of {exp!r} in {path} (it holds "
                f"{self.lock_file}). Wait for it to finish, or stop it: a rerun resumes the "
                "blocks it committed."
            ) from None

    def release(self) -> None:
        """Give the variant back (idempotent)."""
        self._lock.release(force=True)


def scoring_lease(path: str | Path, exp: str, variant: str) -> ScoringLease | None:
    """A ``ScoringLease`` of the local store at ``path``; None for URLs (no file lock there:
    run one scoring of a variant at a time)."""
    return None if "://" in str(path) else ScoringLease(path, exp, variant)
