"""`ray job submit --working-dir <repo>` to a real `ray start --head` on 127.0.0.1: what gets
uploaded, and the documented entrypoint `trak-dist cluster=ray …` giving the reference scores."""

import os
import subprocess
import sys
import time
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from tests.fixtures import clusters
from tests.fixtures.pipeline import P, job_scores, small_job, traker_scores

pytestmark = [pytest.mark.ray, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def package(src: Path, dest: Path) -> zipfile.ZipFile:
    """The zip `ray job submit --working-dir src` uploads, built by Ray's own packaging code
    (.gitignore and .rayignore respected, plus Ray's default excludes: .git, .venv, …)."""
    from ray._private import ray_constants
    from ray._private.runtime_env.packaging import create_package

    excludes = ray_constants.get_runtime_env_default_excludes()
    create_package(str(src), dest, include_gitignore=True, excludes=excludes)
    return zipfile.ZipFile(dest)


def submit(
    run: Callable[[], subprocess.CompletedProcess[str]],
) -> subprocess.CompletedProcess[str]:
    """``run`` (a `ray job submit`) until the head takes it, for up to 2 min: a fresh head's
    dashboard answers before its job agent has registered, and the submission is then refused
    before anything runs, so trying again is safe."""
    deadline = time.time() + 120
    while True:
        out = run()
        refused = "No available agent to submit job" in out.stdout + out.stderr
        if not refused or time.time() > deadline:
            return out
        time.sleep(2)


def test_the_working_dir_upload_leaves_out_environments_outputs_and_builds(tmp_path):
    """A checkout with the usual local leftovers: only the code and conf/ are uploaded."""
    repo = tmp_path / "repo"
    kept = ["trak_dist/cli.py", "conf/config.yaml", "cuda_ext/src/trak_proj.cu", ".gitignore"]
    left_out = [
        ".venv/bin/python",
        "venv/bin/python",
        ".git/HEAD",
        "trak_dist/__pycache__/cli.cpython-311.pyc",
        "trak_dist.egg-info/PKG-INFO",
        "cuda_ext/build/libtrak_proj.so",
        "trak_store.zarr/zarr.json",
        ".trak_cache/digits/mlp32_seed0_ep15.pt",
        "outputs/2026-01-01/00-00-00/trak_report.md",
        "multirun/2026-01-01/00-00-00/0/trak_report.json",
        ".pytest_cache/v/cache/nodeids",
    ]
    for name in kept + left_out:
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text("x")
    (repo / ".gitignore").write_text((ROOT / ".gitignore").read_text())
    files = {n for n in package(repo, tmp_path / "pkg.zip").namelist() if not n.endswith("/")}
    assert files == set(kept)


def test_this_checkout_uploads_small(tmp_path):
    """The real repository as `--working-dir .` sends it: the package and its configs, in well
    under a MiB today (the bound leaves room; a data set or store left in the tree breaks it)."""
    pkg = package(ROOT, tmp_path / "pkg.zip")
    names = set(pkg.namelist())
    assert {"trak_dist/cli.py", "trak_dist/__main__.py", "conf/config.yaml"} <= names
    size = (tmp_path / "pkg.zip").stat().st_size
    biggest = sorted(((i.file_size, i.filename) for i in pkg.infolist()), reverse=True)[:5]
    assert size < 4 * 2**20, f"{size} bytes; largest files: {biggest}"


def test_python_m_trak_dist_runs_the_cli(tmp_path):
    """`python -m trak_dist` is the entrypoint for nodes without the `trak-dist` script."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-m", "trak_dist", "--help"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "== Config groups ==" in out.stdout and "cluster: inprocess, local, ray" in out.stdout


def test_ray_job_submit_with_the_working_dir(tmp_path, monkeypatch, digits_checkpoints):
    """The documented route, verbatim but for paths: a head with a dashboard, the checkout
    uploaded with `--working-dir`, `trak-dist cluster=ray` found on the nodes' PATH (as in an
    activated environment or the Docker image), the single-process TRAKer's scores."""
    reference = traker_scores(tmp_path / "ref.zarr", digits_checkpoints)
    # the job inherits the head's environment: put the interpreter's scripts on its PATH
    monkeypatch.setenv("PATH", f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    store, out_dir = tmp_path / "s.zarr", tmp_path / "out"
    ckpts = ",".join(str(c) for c in digits_checkpoints)
    entrypoint = [
        "trak-dist",
        "cluster=ray",
        # absolute paths: the job's working directory is the unpacked upload, a temp dir
        f"store.path={store}",
        f"hydra.run.dir={out_dir}",
        f"model.checkpoints=[{ckpts}]",
        f"proj_dim={P}",
        "lambda_reg=0.01",
        "featurize.half_precision=false",
        "store.chunk_rows=64",
        "featurize.micro_batch=32",
        "featurize.shard_rows=256",
        "progress=false",
    ]
    with clusters.ray_head(dashboard=True) as head:
        cmd = [str(BIN / "ray"), "job", "submit", "--address", head["dashboard"]]
        cmd += ["--working-dir", str(ROOT), "--", *entrypoint]
        out = submit(lambda: subprocess.run(
            cmd, capture_output=True, text=True, env=clusters.env(), timeout=300, cwd=tmp_path
        ))  # fmt: skip
    log = out.stdout + out.stderr
    assert out.returncode == 0, log[-5000:]
    assert f"Creating a file package for local module '{ROOT}'" in log
    assert "succeeded" in out.stdout
    # the job's own output, tailed by `ray job submit`: the report and where it was written
    assert "Top-k proponents sharing" in out.stdout
    assert f"report: {out_dir / 'trak_report.md'}" in out.stdout
    assert (out_dir / "trak_report.md").is_file()
    scores = job_scores(small_job(store, digits_checkpoints))
    np.testing.assert_allclose(scores, reference, rtol=1e-5, atol=1e-5 * np.abs(reference).max())


def test_ray_job_stop_ends_the_driver_with_one_line(tmp_path, monkeypatch, digits_checkpoints):
    """`ray job stop` sends the entrypoint SIGTERM (then SIGKILL 3 s later): the driver stops
    its actors and says how to resume, in the job's log. Before, Ray's own handler ended it
    with a C++ stack dump ("*** SIGTERM received ***")."""
    monkeypatch.setenv("PATH", f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    store = tmp_path / "s.zarr"
    ckpts = ",".join(str(c) for c in digits_checkpoints)
    entrypoint = [
        "trak-dist", "cluster=ray", f"store.path={store}", f"hydra.run.dir={tmp_path / 'out'}",
        f"model.checkpoints=[{ckpts}]", "store.chunk_rows=64", "featurize.shard_rows=64",
        "progress=false",
    ]  # fmt: skip
    job_id = f"stop-{os.getpid()}"
    with clusters.ray_head(dashboard=True) as head:
        ray_job = [str(BIN / "ray"), "job"]
        at = ["--address", head["dashboard"]]

        def call(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [*ray_job, *args[:1], *at, *args[1:]],
                capture_output=True, text=True, env=clusters.env(), timeout=300, cwd=tmp_path,
            )  # fmt: skip

        out = submit(
            lambda: call("submit", "--no-wait", "--submission-id", job_id, "--", *entrypoint)
        )
        assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
        deadline = time.time() + 300
        while not list(store.glob("train/*/done/c/*")) and time.time() < deadline:
            time.sleep(0.05)
        assert list(store.glob("train/*/done/c/*")), "no chunk was committed"
        stop = call("stop", job_id)
        assert "was stopped" in stop.stdout + stop.stderr, (stop.stdout + stop.stderr)[-3000:]
        logs = call("logs", job_id).stdout
        alive = subprocess.run(
            [str(BIN / "ray"), "list", "actors", "--address", head["address"], "--filter",
             "state=ALIVE"],
            capture_output=True, text=True, env=clusters.env(), timeout=120,
        )  # fmt: skip
    assert "trak-dist: terminated (SIGTERM); committed chunks are kept" in logs, logs[-3000:]
    assert "SIGTERM received" not in logs
    assert "No resource in the cluster" in alive.stdout, alive.stdout[-2000:]
