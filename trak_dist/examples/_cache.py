"""Trained example checkpoints, cached on disk so that only the first run trains."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch


def example_dir(name: str, root: str | None = None) -> Path:
    """``root/name``, with root defaulting to ``$TRAK_DIST_CACHE`` or ``.trak_cache``."""
    path = Path(root or os.environ.get("TRAK_DIST_CACHE", ".trak_cache")) / name
    path.mkdir(parents=True, exist_ok=True)
    return path


def cached_state(path: Path, train: Callable[[], dict[str, torch.Tensor]]) -> Path:
    """``path``, writing ``train()``'s state dict there first if it does not exist yet."""
    if not path.exists():
        # write then rename: concurrent first runs never see a half-written file
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        os.close(fd)
        torch.save(train(), tmp)
        os.replace(tmp, path)
    return path
