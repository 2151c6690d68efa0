"""Tests against a real S3 server (SeaweedFS on loopback, ``tests/fixtures/s3.py``)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import obstore
import pytest
from obstore.store import from_url

from tests.fixtures.pipeline import run_in_process, small_job, stored_features
from tests.fixtures.s3 import S3Server, s3_env, s3_server, s3_url

__all__ = ["s3_env", "s3_server", "s3_url"]


def upload(local: Path, url: str) -> str:
    """``local`` (a file, or a folder's every file) to ``url``; returns ``url``."""
    bucket, _, key = url.split("://", 1)[1].partition("/")
    store = from_url(f"s3://{bucket}", client_options={"allow_http": True})
    files = [local] if local.is_file() else sorted(p for p in local.rglob("*") if p.is_file())
    for f in files:
        name = key if local.is_file() else f"{key}/{f.relative_to(local).as_posix()}"
        obstore.put(store, name, f.read_bytes())
    return url


@pytest.fixture(scope="session", autouse=True)
def _s3_environment(s3_server: S3Server) -> Iterator[None]:
    """The server's credentials and endpoint in the environment of every test here (and of
    the processes they start), as a user exports them."""
    saved = {k: os.environ.get(k) for k in (*s3_server.env(), "AWS_PROFILE")}
    os.environ.update(s3_server.env())
    os.environ.pop("AWS_PROFILE", None)
    yield
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture(scope="session")
def s3_checkpoints(s3_server: S3Server, digits_checkpoints: list[Path]) -> list[str]:
    """The digits checkpoints, uploaded once: their URLs."""
    return [upload(Path(c), s3_server.url(f"ckpt/{Path(c).name}")) for c in digits_checkpoints]


@pytest.fixture(scope="session")
def local_reference(
    tmp_path_factory: pytest.TempPathFactory, digits_checkpoints: list[Path]
) -> tuple[np.ndarray, np.ndarray]:
    """``small_job``'s train X of every checkpoint and scores, on local disk, in process."""
    cfg = small_job(tmp_path_factory.mktemp("local") / "store.zarr", digits_checkpoints)
    run_in_process(cfg)
    return stored_features(cfg)
