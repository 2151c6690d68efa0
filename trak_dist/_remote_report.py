"""Run reports of a store on object storage go beside it, ``<store>.reports/<run>/``, so a
cluster job needs no shared output folder: the printed ``report:`` line names where."""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trak_dist.remote import is_url, put_beside

_DATE = re.compile(r"\d{4}-\d\d-\d\d")
_SAFE = re.compile(r"[\w.-]+")
_UNSAFE = re.compile(r"[^\w.-]+")


def run_name(output_dir: str | Path) -> str:
    """``2026-11-28_02-40-00`` (a run) or ``2026-11-28_02-40-00_3`` (point 3 of a sweep) from
    Hydra's default output folder ``…/2026-11-28/02-40-00[/3]``; another folder's name
    after the time it is published (``2026-11-28_02-40-00_run1``)."""
    parts = Path(output_dir).parts
    for tail in (parts[-2:], parts[-3:]):
        if len(tail) >= 2 and _DATE.fullmatch(tail[0]) and all(_SAFE.fullmatch(t) for t in tail):
            return "_".join(tail)
    last = _UNSAFE.sub("_", parts[-1] if parts else "run")
    return f"{time.strftime('%Y-%m-%d_%H-%M-%S')}_{last}"


def publish(
    files: list[Path], store: str, run: str, options: Mapping[str, Any] | None = None
) -> list[str]:
    """Copy ``files`` (those that exist) to ``<store>.reports/<run>/`` when ``store`` is an
    object store; their URLs (none for a local store)."""
    if not is_url(store):
        return []
    return [
        put_beside(store, f"reports/{run}/{f.name}", f.read_bytes(), options)
        for f in files
        if f.is_file()
    ]
