"""Trained example checkpoints, cached on disk so that only the first run trains.

Every process that needs a checkpoint it has not cached trains it itself: on a cluster without
shared storage, each node trains its own copy (``trak_dist.sources.node_checkpoints``). The
copies are the same bytes, which the store's checkpoint fingerprints check: training runs on one
thread (a matmul's rounding depends on the thread count: the digits MLP trained on 2 threads
differs from the one trained on 1) and the file is written from memory (``torch.save`` to a path
names the archive inside after the file, and the temporary file's name is random)."""

from __future__ import annotations

import contextlib
import io
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import torch


def example_dir(name: str, root: str | None = None) -> Path:
    """``root/name``, with root defaulting to ``$TRAK_DIST_CACHE`` or ``.trak_cache``."""
    path = Path(root or os.environ.get("TRAK_DIST_CACHE", ".trak_cache")) / name
    path.mkdir(parents=True, exist_ok=True)
    return path


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def cached_state(path: Path, train: Callable[[], dict[str, torch.Tensor]]) -> Path:
    """``path``, writing ``train()``'s state dict there first if it does not exist yet (the same
    bytes in every process, see the module's docstring)."""
    if not path.exists():
        with one_thread():
            state = train()
        buffer = io.BytesIO()
        torch.save(state, buffer)
        # write then rename: concurrent first runs never see a half-written file
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(buffer.getvalue())
        os.replace(tmp, path)
    return path
