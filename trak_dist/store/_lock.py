"""One process at a time creates or featurises a store (``<store>.lock`` beside it): parallel
jobs on one store would otherwise race to create it or rewrite factors under readers. One
process at a time prepares and finishes each scoring variant (``ScoringLease``,
``<store>.scoring-<exp>-<variant>.lock``). A local store's are file locks; an object store's
(``s3://…``) are lease objects of the same names beside it (``_lease.py``), never local files."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from trak_dist.errors import StoreStateError
from trak_dist.remote import is_url, local_path
from trak_dist.store._lease import Lease

logger = logging.getLogger(__name__)


# this process's store leases, with how many nested ``store_lock`` hold each (re-entrant, as
# the file lock is)
_HELD: dict[str, tuple[Lease, int]] = {}
_HELD_LOCK = threading.Lock()


@contextlib.contextmanager
def store_lock(
    path: str | Path, wait: bool = True, options: Mapping[str, Any] | None = None
) -> Iterator[bool]:
    """Hold the inter-process lock of the store at ``path`` (re-entrant): a file lock beside a
    local store, a lease object beside an object store (``options``: its ``store.options``).

    Args:
        path: the store.
        wait: block until free; with False, yield False at once when another process holds it
            (for skippable work such as folding staged rows).
        options: the object store's options (``store.options``).

    Yields:
        Whether the caller may go ahead (always True when ``wait``).
    """
    where = str(path)
    if is_url(where):
        with _store_lease(where, wait, options) as free:
            yield free
        return
    lock_file = Path(f"{Path(local_path(where)).resolve()}.lock")
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


@contextlib.contextmanager
def _store_lease(url: str, wait: bool, options: Mapping[str, Any] | None) -> Iterator[bool]:
    with _HELD_LOCK:
        held = _HELD.get(url)
        if held is not None:
            _HELD[url] = (held[0], held[1] + 1)
    if held is None:
        lease = Lease(url, "lock", "featurising", options)

        def busy(body: dict[str, Any]) -> None:
            if wait:
                logger.warning(
                    "waiting for another trak-dist process using %s (pid %s on %s holds %s since "
                    "%s; a holder that stops renewing it loses it after %.0f s)",
                    url, body.get("pid"), body.get("host"), lease.where, body.get("written"),
                    float(body.get("ttl_s", lease.ttl)),
                )  # fmt: skip

        if not lease.acquire("free" if wait else "look", on_busy=busy):
            yield False
            return
        with _HELD_LOCK:
            _HELD[url] = (lease, 1)
    try:
        yield True
    finally:
        with _HELD_LOCK:
            lease, count = _HELD[url]
            if count > 1:
                _HELD[url] = (lease, count - 1)
            else:
                del _HELD[url]
        if count == 1:
            lease.release()


class ScoringLease:
    """One variant's scoring of a local store, held by the process that prepares it until it
    publishes or gives up (``release``); the OS drops it with a killed process. A second
    scoring of the variant meanwhile would resume the same unfinished set, or remove it
    (another plan), under the first: it fails at once instead."""

    def __init__(self, path: str | Path, exp: str, variant: str) -> None:
        self.lock_file = Path(
            f"{Path(local_path(str(path))).resolve()}.scoring-{exp}-{variant}.lock"
        )
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


class RemoteScoringLease(ScoringLease):
    """``ScoringLease`` of an object store: the lease object
    ``<store>.scoring-<exp>-<variant>.lock``. Held by a live process (it renews it), a second
    scoring fails; left by a killed one, it is taken over once unrenewed for its ttl."""

    def __init__(  # no file lock: super().__init__ is not called
        self, url: str, exp: str, variant: str, options: Mapping[str, Any] | None = None
    ) -> None:
        self._lease = Lease(
            url, f"scoring-{exp}-{variant}.lock", f"scoring {variant!r} of {exp!r}", options
        )
        self.lease_object = self._lease.where
        if not self._lease.acquire("renewed"):
            raise StoreStateError(
                f"another process is scoring {variant!r} of {exp!r} in {url} (it renews the "
                f"lease {self.lease_object}). Wait for it to finish, or stop it: a rerun "
                "resumes the blocks it committed."
            )
        self._released = False

    def release(self) -> None:
        """Give the variant back (idempotent)."""
        if not self._released:
            self._released = True
            self._lease.release()


def scoring_lease(
    path: str | Path, exp: str, variant: str, options: Mapping[str, Any] | None = None
) -> ScoringLease:
    """The ``ScoringLease`` of the store at ``path``: a file lock, or a lease object beside an
    object store."""
    if is_url(path):
        return RemoteScoringLease(str(path), exp, variant, options)
    return ScoringLease(path, exp, variant)
