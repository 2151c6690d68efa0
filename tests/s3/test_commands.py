"""Every command against a store on S3, run as a user runs them (``trak-dist`` in a subprocess,
a local Ray), with checkpoints on S3 too: the job, its report in the store, ``show``,
``store verify`` / ``repair``, a multirun sweep resuming the repaired chunk, one-line errors
that write nothing, and no credential in any output."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import obstore
import pytest
from obstore.store import from_url

from tests.fixtures.pipeline import CHUNK, LAMBDA, P
from tests.fixtures.s3 import SECRET_KEY, S3Server
from trak_dist.store import FeatureStore, variant_name

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


def test_the_job_show_verify_repair_and_a_sweep(
    s3_url, s3_env, s3_checkpoints, digits_checkpoints, tmp_path
):
    """The same command with the store and checkpoints on local disk is the reference: the
    scores must equal it to the bit (an in-process run rounds the scoring matmul otherwise:
    its thread count differs from a Ray actor's)."""
    local = tmp_path / "local"
    local.mkdir()
    ref = trak_dist(
        job_args(str(local / "store.zarr"), [str(c) for c in digits_checkpoints]), local, s3_env
    )
    assert ref.returncode == 0, ref.stderr[-3000:]
    expected = FeatureStore.open(local / "store.zarr", mode="r").score_set(
        "targets", variant_name(P, LAMBDA)
    )
    assert expected is not None
    reference = expected.scores()
    work = tmp_path / "work"
    work.mkdir()
    tmp_path = work
    args = job_args(s3_url, s3_checkpoints)
    run = trak_dist([*args, "hydra.run.dir=run1"], tmp_path, s3_env)
    assert run.returncode == 0, run.stderr[-3000:]
    report_url = run.stdout.strip().splitlines()[-1].removeprefix("report: ")
    assert report_url.startswith(f"{s3_url}.reports/") and report_url.endswith("trak_report.md")
    parent = s3_url.rsplit("/", 1)[0]
    names = keys(parent)
    stem = report_url[len(parent) + 1 : -len(".md")]
    assert f"{stem}.md" in names and f"{stem}.json" in names and f"{stem}.png" in names
    assert "store.zarr.lock" in names  # the lease, given back
    client = from_url(parent, client_options={"allow_http": True})
    report = json.loads(bytes(obstore.get(client, f"{stem}.json").bytes()))
    assert report["store"] == s3_url and report["rows_computed"]["train"] == 2 * 1500
    store = FeatureStore.open(s3_url, mode="r")
    sset = store.score_set("targets", variant_name(P, LAMBDA))
    assert sset is not None
    np.testing.assert_array_equal(sset.scores(), reference)
    # on local disk: Hydra's run folder and the node's copy of the checkpoints, nothing else
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "run1"]
    assert not list(tmp_path.rglob("*.lock"))

    show = trak_dist(["show", *args], tmp_path, s3_env)
    assert show.returncode == 0, show.stderr[-3000:]
    assert "target 0:" in show.stdout

    chunk = "train/1/X/c/3/0"
    client = from_url(s3_url, client_options={"allow_http": True})  # the store's own prefix
    raw = bytearray(bytes(obstore.get(client, chunk).bytes()))
    raw[7] ^= 1
    obstore.put(client, chunk, bytes(raw))
    damaged = trak_dist(["store", "verify", s3_url], tmp_path, s3_env)
    assert damaged.returncode == 1 and "train/1/X chunk 3 (rows [192, 256))" in damaged.stdout
    fixed = trak_dist(["store", "repair", s3_url], tmp_path, s3_env)
    assert fixed.returncode == 0 and "un-committed 1 chunk(s) of train/1" in fixed.stdout

    # a sweep on the same store: featurises only the repaired chunk, scores both widths
    sweep = trak_dist(["-m", *args, f"proj_dim={P // 2},{P}"], tmp_path, s3_env)
    assert sweep.returncode == 0, sweep.stderr[-3000:]
    assert f"sweep summary: {s3_url}.reports/" in sweep.stdout
    reports = sorted(tmp_path.glob("multirun/*/*/*/trak_report.json"))
    assert len(reports) == 2
    first = json.loads(reports[0].read_text())
    assert first["rows_computed"] == {"train": CHUNK, "target": 0}
    again = FeatureStore.open(s3_url, mode="r").score_set("targets", variant_name(P, LAMBDA))
    assert again is not None
    np.testing.assert_array_equal(again.scores(), reference)
    no_secret(run.stdout, run.stderr, show.stdout, show.stderr, sweep.stdout, sweep.stderr)
    no_secret(
        *(
            p.read_text(errors="replace")
            for p in tmp_path.rglob("*")
            if p.is_file() and p.suffix in (".log", ".yaml", ".json", ".md")
        )
    )


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
