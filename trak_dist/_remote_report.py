"""Run reports of a store on object storage go beside it, ``<store>.reports/<run>/``, so a
cluster job needs no shared output folder: the printed ``report:`` line names where."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trak_dist.store import is_url, put_beside


def run_name(output_dir: str | Path) -> str:
    """``2026-11-28_02-40-00`` (a run) or ``2026-11-28_02-40-00_3`` (point 3 of a sweep) from
    Hydra's output folder ``…/2026-11-28/02-40-00[/3]``."""
    parts = Path(output_dir).parts[-3:]
    if not (parts and parts[-1].isdigit() and len(parts) == 3):
        parts = parts[-2:]
    return re.sub(r"[^\w.-]+", "_", "_".join(parts)) or "run"


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
