"""The Ray driver on real Ray: split-invariance, worker and driver kills, a real `ray start`."""

import dataclasses
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest

from tests.fixtures import clusters
from tests.fixtures.pipeline import P, job_scores, small_job, traker_scores
from trak_dist.distributed import run_job
from trak_dist.errors import WorkerFailedError

pytestmark = [pytest.mark.ray, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
N_TRAIN = 1500


@pytest.fixture(scope="module")
def reference(tmp_path_factory, digits_checkpoints):
    return traker_scores(tmp_path_factory.mktemp("ref") / "s.zarr", digits_checkpoints)


def close(a, b, rel=1e-5):
    np.testing.assert_allclose(a, b, rtol=rel, atol=rel * np.abs(b).max())


@pytest.mark.parametrize(("workers", "shard_rows"), [(1, 1024), (2, 64), (2, None)])
def test_scores_do_not_depend_on_the_split(
    ray_session, tmp_path, digits_checkpoints, reference, workers, shard_rows
):
    """1 or 2 workers, shards of 64 or 1024 rows or automatic: the single-process TRAKer's
    scores at rtol 1e-5 (float32 rounding of the score matmuls; X is bitwise the same)."""
    cfg = small_job(tmp_path / "s.zarr", digits_checkpoints, workers, shard_rows)
    result = run_job(cfg)
    assert result.rows_computed == {"train": 2 * N_TRAIN, "target": 2 * 297}
    close(job_scores(cfg), reference)


def test_worker_killed_mid_shard_is_replaced(ray_session, tmp_path, digits_checkpoints, reference):
    killed = []

    def kill_once(result):
        # the worker that just reported was handed its next shard before this hook runs
        if not killed and result.task.kind == "train":
            pid = int(result.worker.rsplit(":", 1)[1])
            psutil.Process(pid).kill()
            killed.append(pid)

    cfg = small_job(tmp_path / "s.zarr", digits_checkpoints, workers=2, shard_rows=128)
    result = run_job(cfg, on_shard=kill_once)
    assert len(killed) == 1 and not psutil.pid_exists(killed[0])
    assert result.worker_restarts == 1 and result.task_retries == 1
    assert result.rows_computed["train"] + result.rows_reused["train"] >= 2 * N_TRAIN
    close(job_scores(cfg), reference)


DRIVER = """
import sys
from pathlib import Path
from tests.fixtures.pipeline import small_job
from trak_dist.distributed import run_job
from trak_dist.errors import WorkerFailedError
import os, signal
cfg = small_job(Path({store!r}), [Path(p) for p in {ckpts!r}], workers=2, shard_rows=128)
train = []

def on_shard(r):
    print("SHARD", r.task.kind, flush=True)
    train.append(r.task.kind == "train")
    if sum(train) == 4:  # killed by itself: the kill point does not depend on how fast the
        os.killpg(0, signal.SIGKILL)  # test reads (a loaded CI machine read 16 shards late)

run_job(cfg, on_shard=on_shard)
print("FINISHED", flush=True)
"""


def test_killed_driver_resumes_from_committed_chunks(
    ray_session, tmp_path, digits_checkpoints, reference
):
    store = tmp_path / "s.zarr"
    script = DRIVER.format(store=str(store), ckpts=[str(c) for c in digits_checkpoints])
    proc = subprocess.Popen(
        [sys.executable, "-c", script],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
        cwd=ROOT,  # `python -c` looks up tests.fixtures in its working directory
    )
    try:
        done = 0
        for line in proc.stdout:  # type: ignore[union-attr]
            assert "FINISHED" not in line, "the driver finished before it could be killed"
            done += line.startswith("SHARD train")
            if done == 4:
                break
    finally:
        # the whole process group, as SLURM or Ctrl-C would: driver, its Ray and its workers
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        proc.stdout.close()  # type: ignore[union-attr]
    deadline = time.time() + 20
    while time.time() < deadline:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            break
        time.sleep(0.5)
    cfg = small_job(store, digits_checkpoints, workers=2, shard_rows=128)
    result = run_job(cfg)
    reused, computed = result.rows_reused["train"], result.rows_computed["train"]
    assert reused >= 4 * 128, "the chunks committed before the kill were recomputed"
    # at most the shards in flight at the kill (one per worker) committed after it
    assert reused <= 6 * 128
    assert reused + computed == 2 * N_TRAIN
    close(job_scores(cfg), reference)
    again = run_job(cfg)
    assert again.rows_computed == {"train": 0, "target": 0}
    # nothing planned: every row counts as reused from the store (before: 0 were reported)
    assert again.rows_reused == {"train": 2 * N_TRAIN, "target": 2 * 297}


def test_pipeline_on_a_real_ray_start_head(tmp_path, digits_checkpoints, reference):
    """`ray start --head` on 127.0.0.1, the CLI connecting with cluster.address, head stopped
    by its PID."""
    with clusters.ray_head() as head:
        store = tmp_path / "s.zarr"
        ckpts = ",".join(str(c) for c in digits_checkpoints)
        cmd = [
            str(Path(sys.executable).with_name("trak-dist")),
            "cluster=ray",
            f"cluster.address={head['address']}",
            f"store.path={store}",
            f"proj_dim={P}",
            "lambda_reg=0.01",
            f"model.checkpoints=[{ckpts}]",
            "featurize.half_precision=false",
            "store.chunk_rows=64",
            "featurize.micro_batch=32",
            "featurize.shard_rows=256",
            "progress=false",
            f"hydra.run.dir={tmp_path / 'out'}",
        ]
        out = subprocess.run(
            cmd, capture_output=True, text=True, env=clusters.env(), timeout=300, cwd=tmp_path
        )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "Top-k proponents sharing" in out.stdout
    assert (tmp_path / "out" / "trak_report.md").is_file()
    close(job_scores(small_job(store, digits_checkpoints)), reference)


def test_a_worker_that_cannot_start_fails_fast_with_its_cause(
    ray_session, tmp_path, digits_checkpoints
):
    from trak_dist.examples import digits

    driver = os.getpid()

    def model_only_on_the_driver():
        if os.getpid() != driver:
            raise RuntimeError("no GPU driver on this worker")
        return digits.make_model()

    cfg = small_job(tmp_path / "s.zarr", digits_checkpoints)
    cfg = dataclasses.replace(
        cfg, model=dataclasses.replace(cfg.model, factory=model_only_on_the_driver)
    )
    t0 = time.perf_counter()
    with pytest.raises(WorkerFailedError, match="no GPU driver on this worker"):
        run_job(cfg)
    assert time.perf_counter() - t0 < 60  # no pointless restarts
