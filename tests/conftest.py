"""Shared fixtures. Tests mirror the package; see pyproject.toml for markers."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


@pytest.fixture
def store_path(tmp_path: Path) -> Path:
    return tmp_path / "store.zarr"
