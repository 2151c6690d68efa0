"""The array launcher's four stages (shards, reduce, score tasks, merge) on submitit's local
executor: no SLURM needed, so they run wherever the tests do (tests/launch/test_slurm.py runs
them on a real SLURM and checks the bits)."""

import dataclasses
from pathlib import Path

import numpy as np

from launch.slurm import submit_array
from tests.fixtures.pipeline import job_scores, run_in_process, small_job

ROOT = Path(__file__).resolve().parents[2]


def test_local_array_scores_in_three_tasks_as_in_process(tmp_path, digits_checkpoints, monkeypatch):
    monkeypatch.chdir(ROOT)  # the jobs import launch/ from the submitting directory
    jobs = []
    for name in ("here", "local"):
        cfg = small_job(tmp_path / f"{name}.zarr", digits_checkpoints)
        scoring = dataclasses.replace(cfg.scoring, train_block=128, block_rows=256)
        jobs.append(dataclasses.replace(cfg, scoring=scoring))
    run_in_process(jobs[0])
    sub = submit_array(jobs[1], tmp_path / "jobs", tasks=2, local=True, score_tasks=3)
    scoring = sub.merge.result()["variants"][0]["scoring"]
    assert (scoring["blocks"], scoring["blocks_computed"], scoring["blocks_reused"]) == (6, 6, 0)
    assert [len(j.result()) for j in sub.scores] == [2, 2, 2]
    s, s_ref = job_scores(jobs[1]), job_scores(jobs[0])
    # XᵀX summed from the store, not from shard partials: float64 rounding apart
    np.testing.assert_allclose(s, s_ref, rtol=1e-5, atol=1e-5 * np.abs(s_ref).max())
