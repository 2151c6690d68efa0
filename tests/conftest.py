"""Shared fixtures. Tests mirror the package; see pyproject.toml for markers."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


@pytest.fixture
def store_path(tmp_path: Path) -> Path:
    return tmp_path / "store.zarr"


@pytest.fixture(scope="session")
def digits_checkpoints(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    from trak_dist.examples import digits

    return digits.checkpoints(num=2, epochs=5, cache_dir=str(tmp_path_factory.mktemp("cache")))


@pytest.fixture(scope="session")
def ray_session():
    """One in-process Ray cluster for every test that needs one (starting one costs ~5 s)."""
    import ray

    ray.init(
        address="local",
        num_cpus=2,
        include_dashboard=False,
        object_store_memory=256 * 2**20,
        logging_level="ERROR",
    )
    yield ray
    ray.shutdown()
