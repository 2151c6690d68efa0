"""SIGKILL of the `trak-dist` driver while its Ray workers score (issue 19: killing the driver
during scoring and rerunning gives the same top-k, recomputing only unfinished blocks). The
driver is killed alone, as a crash or the OOM killer would; the test then checks that its Ray
processes went with it, and that the rerun reuses exactly the blocks committed before.

Measured here (Ray 2.60): raylet, GCS and the workers end with the driver; the dashboard and
runtime-env agents ~62 s later (they retry reporting raylet's death to the dead GCS first)."""

from __future__ import annotations

import glob
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import psutil
import pytest

from tests.faults.test_runtime_faults import CLI, cli_env, job_args, run_cli
from tests.fixtures.fault_data import FAULT_DATA
from tests.fixtures.helpers import still_running
from tests.fixtures.pipeline import LAMBDA, P
from trak_dist.store import FeatureStore, variant_name

pytestmark = [pytest.mark.ray, pytest.mark.slow]
# 24 train ranges of 64 rows × 10 super-blocks of 32 targets (297 targets): 240 blocks, a few
# seconds of scoring on two workers, so the kill lands between the first and the last commit.
# The memory fits C=2 sub-blocks of X [64, 64] and [64, 32] scores next to 32 targets' Y and
# top lists (scoring/_plan.py): 65536 + 32 × 992 bytes.
SCORING = [
    "scoring.write_scores=topk",
    "scoring.train_block=64",
    "scoring.block_rows=64",
    "scoring.target_block=32",
    "scoring.memory=97280",
    "cluster.num_workers=2",
]
BLOCKS = 24 * 10


def flags(store: Path) -> list[str]:
    """The commit flags of the unfinished score set's blocks (one file per committed block)."""
    return glob.glob(
        str(store / "scores" / "targets" / "*.partial-*" / "parts" / "done" / "c" / "*" / "*")
    )


def top_k(store: Path) -> dict[str, np.ndarray]:
    sset = FeatureStore.open(store, mode="r").score_set("targets", variant_name(P, LAMBDA))
    assert sset is not None and not sset.full, f"no top-k-only scores in {store}"
    return sset.read_topk()


def report(run_dir: Path) -> dict:
    (variant,) = json.loads((run_dir / "trak_report.json").read_text())["variants"]
    return variant["scoring"]


def test_sigkill_of_the_driver_while_scoring_and_the_rerun_reuses_committed_blocks(
    tmp_path, digits_checkpoints
):
    (tmp_path / "faultdata.py").write_text(FAULT_DATA)
    clean = tmp_path / "clean.zarr"
    out = run_cli(job_args(tmp_path / "a", digits_checkpoints, clean, *SCORING), tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    clean_run = report(tmp_path / "a" / "out")
    assert (clean_run["blocks"], clean_run["blocks_computed"]) == (BLOCKS, BLOCKS)

    store = tmp_path / "killed.zarr"  # the same features, scored again
    shutil.copytree(clean, store, ignore=shutil.ignore_patterns("scores"))
    args = job_args(tmp_path / "b", digits_checkpoints, store, *SCORING)
    proc = subprocess.Popen(
        [*CLI, *args],
        cwd=tmp_path,
        env=cli_env(tmp_path),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group: the cleanup below reaches all of it
    )
    driver = psutil.Process(proc.pid)
    seen: dict[int, psutil.Process] = {}
    try:
        deadline = time.time() + 300
        while not flags(store) and proc.poll() is None and time.time() < deadline:
            for child in driver.children(recursive=True):
                seen.setdefault(child.pid, child)
            time.sleep(0.02)
        for child in driver.children(recursive=True):
            seen.setdefault(child.pid, child)
        assert proc.poll() is None, f"the job ended before the kill: {proc.communicate()[1]}"
        os.kill(proc.pid, signal.SIGKILL)  # the driver alone
        proc.wait(timeout=30)
        job = list(seen.values())
        # raylet, GCS and workers go at once; Ray's dashboard and runtime-env agents first
        # try to tell the dead GCS that raylet died, for its reconnect timeout (60 s)
        left = still_running(job, timeout=120)
    finally:
        if proc.poll() is None or any(p.is_running() for p in seen.values()):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
    assert proc.returncode == -signal.SIGKILL
    assert len(job) >= 4, f"the job's Ray processes were not seen: {job}"  # GCS, raylet, workers
    assert left == [], f"processes of the killed driver are still running: {left}"
    committed = len(flags(store))
    assert 0 < committed < BLOCKS, f"{committed} of {BLOCKS} blocks committed at the kill"

    again = run_cli(args, tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    resumed = report(tmp_path / "b" / "out")
    assert (resumed["blocks_reused"], resumed["blocks_computed"]) == (committed, BLOCKS - committed)
    clean_top, top = top_k(clean), top_k(store)
    for key, value in clean_top.items():
        np.testing.assert_array_equal(top[key], value)
