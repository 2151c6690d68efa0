"""`trak-dist` then `trak-dist eval` as a user runs them: kill the eval, resume it, sweep by LDS."""

import csv
import os
import signal
import subprocess
import time

import numpy as np
import pytest
import zarr

from tests.test_cli import CLI, trak_dist

M = 24


def done_models(store):
    try:
        return np.asarray(zarr.open_group(str(store), mode="r")["eval/targets/done"][:]).astype(
            bool
        )
    except (KeyError, FileNotFoundError, ValueError):  # not created yet
        return np.zeros(0, dtype=bool)


def test_eval_help_names_its_options(tmp_path):
    out = trak_dist(["eval", "--help"], tmp_path)
    assert out.returncode == 0
    assert out.stdout.startswith("usage: trak-dist eval [OVERRIDE ...]")
    assert "eval.num_models (100), eval.alpha (0.5)" in out.stdout


def test_eval_without_a_store_is_one_clear_line(tmp_path):
    out = trak_dist(["eval", "store.path=nowhere.zarr"], tmp_path)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines()[-1].startswith("trak-dist eval: error: no trak_dist")
    assert "Traceback" not in out.stderr


@pytest.mark.slow
@pytest.mark.ray
def test_killed_eval_resumes_without_retraining_and_sweeps_rank_by_lds(tmp_path):
    # the attribution jobs run in process (no Ray: ~20 s less each); `trak-dist eval` on Ray
    first = trak_dist(
        ["hydra.run.dir=run1", "progress=false", "cluster=inprocess"], tmp_path, timeout=900
    )
    assert first.returncode == 0, first.stderr[-3000:]
    assert "- λ: auto (" in first.stdout and "LDS: not measured" in first.stdout

    store = tmp_path / "trak_store.zarr"
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(TRAK_DIST_CACHE=str(tmp_path / "cache"), RAY_USAGE_STATS_ENABLED="0")
    args = [*CLI, "eval", f"eval.num_models={M}", "progress=false"]
    # its own session, so that SIGKILL reaches the driver and the Ray it started, and only them
    proc = subprocess.Popen(
        args,
        cwd=tmp_path,
        env=env,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 300
    while done_models(store).sum() < 4:
        assert proc.poll() is None, proc.stderr.read()[-3000:]
        assert time.monotonic() < deadline, "no subset model finished within 300 s"
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    proc.stderr.close()
    killed = done_models(store)
    assert 4 <= killed.sum() < M, f"{killed.sum()} of {M} done before the kill"
    kept = np.asarray(zarr.open_group(str(store), mode="r")["eval/targets/margins"][:])[killed]

    second = trak_dist(
        ["eval", f"eval.num_models={M}", "eval.output_dir=lds"], tmp_path, timeout=900
    )
    assert second.returncode == 0, second.stderr[-3000:]
    k = int(killed.sum())
    assert f"subset models: {M - k} trained, {k} reused from the store" in second.stdout
    assert "| p512_lambdaauto (best) | 512 | auto |" in second.stdout
    assert "best: p512_lambdaauto, LDS 0." in second.stdout and "95 % interval" in second.stdout
    assert done_models(store).all()
    margins = np.asarray(zarr.open_group(str(store), mode="r")["eval/targets/margins"][:])
    np.testing.assert_array_equal(margins[killed], kept)  # finished models were not retrained
    for name in ("lds.md", "lds.csv", "lds.json", "lds.png"):
        assert (tmp_path / "lds" / name).is_file()
    with open(tmp_path / "lds" / "lds.csv") as f:
        (row,) = list(csv.DictReader(f))
    assert float(row["low"]) <= float(row["lds"]) <= float(row["high"]) and int(row["models"]) == M

    # a sweep over λ now reports the LDS of every point and names the best one
    sweep = trak_dist(
        [
            "-m",
            "lambda_reg=auto,0.01",
            "hydra.sweep.dir=sweep",
            "progress=false",
            "cluster=inprocess",
        ],
        tmp_path,
        timeout=900,
    )
    assert sweep.returncode == 0, sweep.stderr[-3000:]
    with open(tmp_path / "sweep" / "sweep_summary.csv") as f:
        points = {r["lambda_reg"]: r for r in csv.DictReader(f)}
    assert set(points) == {"auto", "0.01"}
    assert all(0 < float(p["lds"]) < 1 for p in points.values())
    best = max(points.values(), key=lambda p: float(p["lds"]))
    summary = (tmp_path / "sweep" / "sweep_summary.md").read_text()
    assert f"best point (highest LDS): job {best['job']}" in summary
    assert (tmp_path / "sweep" / "sweep_summary.png").is_file()
    report = (tmp_path / "sweep" / "0" / "trak_report.md").read_text()
    assert f"retrained subset models output): {float(points['auto']['lds']):.3f}" in report

    # a λ sweep from the stored features: no subset model retrained, every λ's LDS, the best
    # recorded in the store, and `lambda_reg=best` scores with it
    swept = trak_dist(
        ["eval", f"eval.num_models={M}", "eval.lambdas=[0.1,1]", "eval.output_dir=lds2"],
        tmp_path,
        timeout=900,
    )
    assert swept.returncode == 0, swept.stderr[-3000:]
    assert f"subset models: 0 trained, {M} reused from the store" in swept.stdout
    assert "for eval.lambdas: p512_lambda0.1, p512_lambda1\n" in swept.stdout
    with open(tmp_path / "lds2" / "lds.csv") as f:
        rows = {r["lambda_reg"]: r for r in csv.DictReader(f)}
    assert set(rows) == {"auto", "0.01", "0.1", "1.0"}
    top = max(rows.values(), key=lambda r: float(r["lds"]))
    assert (
        f"recorded for lambda_reg=best at proj_dim=512: λ={top['lambda_reg']} ({top['variant']}, "
        f"LDS {float(top['lds']):.3f}" in swept.stdout
    )
    used = trak_dist(
        ["lambda_reg=best", "hydra.run.dir=run2", "progress=false", "cluster=inprocess"],
        tmp_path,
        900,
    )
    assert used.returncode == 0, used.stderr[-3000:]
    report = (tmp_path / "run2" / "trak_report.md").read_text()
    assert f"## scores `{top['variant']}`" in report
    assert f"subset models output): {float(top['lds']):.3f}" in report
