"""A store on S3 that cannot be used, as a user meets it (``trak-dist`` in a subprocess, a
local Ray, checkpoints on S3 too): one-line errors that write nothing, no credential in any
output. The job, its report in the store, ``show``, ``store verify`` / ``repair`` and a sweep
on S3 are checked by hand (benchmarks/remote_checks/s3/test_commands.py: over CI's budget)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import obstore
import pytest
from obstore.store import from_url

from tests.fixtures.pipeline import CHUNK, LAMBDA, P
from tests.fixtures.s3 import SECRET_KEY, S3Server

pytestmark = [pytest.mark.s3, pytest.mark.ray, pytest.mark.slow]
CLI = [sys.executable, "-c", "from trak_dist.cli import main; main()"]


def trak_dist(args: list[str], cwd: Path, env: dict[str, str], timeout: int = 600):
    full = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    full.update(env, TRAK_DIST_CACHE=str(cwd / "cache"), RAY_USAGE_STATS_ENABLED="0")
    return subprocess.run(
        [*CLI, *args], capture_output=True, text=True, cwd=cwd, env=full, timeout=timeout
    )


def job_args(store: str, checkpoints: list[str]) -> list[str]:
    """``tests.fixtures.pipeline.small_job`` as overrides (the local reference's settings)."""
    return [
        f"store.path={store}", f"model.checkpoints=[{','.join(checkpoints)}]",
        f"proj_dim={P}", f"lambda_reg={LAMBDA}", f"store.chunk_rows={CHUNK}",
        "featurize.shard_rows=256", "featurize.micro_batch=32", "featurize.half_precision=false",
        "cluster.num_workers=2", "progress=false",
    ]  # fmt: skip


def keys(url: str) -> list[str]:
    store = from_url(url, client_options={"allow_http": True})
    return sorted(o["path"] for batch in obstore.list(store) for o in batch)


def no_secret(*texts: str) -> None:
    for text in texts:
        assert SECRET_KEY not in text


def _no_obstore(tmp_path: Path) -> dict[str, str]:
    shim = tmp_path / "shim" / "obstore"
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text("raise ImportError('obstore is not installed (test)')\n")
    return {"PYTHONPATH": f"{shim.parent}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}


@pytest.mark.parametrize("case", ["wrong secret", "no bucket", "no obstore"])
def test_a_store_that_cannot_be_used_is_one_line_and_nothing_written(
    case, s3_url, s3_env, s3_server: S3Server, s3_checkpoints, tmp_path
):
    env, url = dict(s3_env), s3_url
    if case == "wrong secret":
        env["AWS_SECRET_ACCESS_KEY"] = "wrong-secret-0f0f0f0f"
        expected = "access denied (SignatureDoesNotMatch)"
    elif case == "no bucket":
        url = "s3://no-such-bucket-trak/run.zarr"
        expected = "the bucket 'no-such-bucket-trak' does not exist at http://127.0.0.1:"
    else:
        env.update(_no_obstore(tmp_path))
        expected = "needs obstore, which is not installed: pip install 'trak_dist[s3]'"
    out = trak_dist(job_args(url, s3_checkpoints), tmp_path, env, timeout=300)
    assert out.returncode == 2, out.stderr[-3000:]
    errors = [line for line in out.stderr.splitlines() if line.startswith("trak-dist: error:")]
    assert len(errors) == 1 and expected in errors[0] and url in errors[0], out.stderr[-3000:]
    assert "Traceback" not in out.stderr
    no_secret(out.stdout, out.stderr)
    assert "wrong-secret-0f0f0f0f" not in out.stdout + out.stderr
    assert keys(s3_url.rsplit("/", 1)[0]) == []
