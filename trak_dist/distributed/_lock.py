"""One featurising job per store at a time, across processes and machines sharing the store."""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path

from filelock import FileLock, Timeout

logger = logging.getLogger(__name__)


def store_lock(path: str) -> contextlib.AbstractContextManager[object]:
    """An inter-process lock next to a local store (``<store>.lock``); none for URLs."""
    if "://" in str(path):
        logger.warning("no lock for the remote store %s: run one featurising job at a time", path)
        return contextlib.nullcontext()
    lock = FileLock(f"{Path(path).resolve()}.lock")
    try:
        lock.acquire(timeout=0)
    except Timeout:
        logger.warning("waiting for another trak-dist job that is featurising %s", path)
        lock.acquire()
    return _Held(lock)


class _Held(contextlib.AbstractContextManager[object]):
    def __init__(self, lock: FileLock) -> None:
        self.lock = lock

    def __exit__(self, *exc: object) -> None:
        self.lock.release()
