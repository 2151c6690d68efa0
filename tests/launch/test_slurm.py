"""The SLURM launchers against a real single-node SLURM (slurmctld, slurmd, slurmdbd, munge)."""

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import cloudpickle
import numpy as np
import pytest
import submitit
from torch.utils.data import Dataset

from launch._executor import pending, share
from launch._ray_cluster import evaluate_and_report
from launch.slurm import submit_array, submit_ray
from tests.fixtures import llm_models
from tests.fixtures.clusters import LOOPBACK_ENV, free_port
from tests.fixtures.helpers import one_thread
from tests.fixtures.pipeline import (
    CHUNK,
    LAMBDA,
    WIDE,
    P,
    job_scores,
    kron_job,
    run_in_process,
    small_job,
    stored_features,
    traker_scores,
)
from trak_dist import failures
from trak_dist._compose import compose_job
from trak_dist.examples import digits
from trak_dist.store import FeatureStore, variant_name

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
# the SLURM jobs unpickle what this module defines (a slow dataset) without importing it
cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture(scope="module")
def reference(tmp_path_factory, digits_checkpoints):
    return traker_scores(tmp_path_factory.mktemp("ref") / "s.zarr", digits_checkpoints)


def close(a, b, rel=1e-5):
    np.testing.assert_allclose(a, b, rtol=rel, atol=rel * np.abs(b).max())


def test_array_mode_reduces_after_its_tasks(
    slurm, tmp_path, digits_checkpoints, reference, monkeypatch
):
    monkeypatch.chdir(ROOT)  # jobs start in the submitting directory and import launch/ there
    cfg = small_job(tmp_path / "s.zarr", digits_checkpoints, shard_rows=256)
    sub = submit_array(cfg, tmp_path / "jobs", tasks=2, partition=slurm, timeout_min=10)
    assert len(sub.shards) == 2
    summary = sub.merge.result()
    results = [j.result() for j in sub.shards]
    assert sum(sum(r.rows_computed.values()) for r in results) == 2 * (1500 + 297)
    assert Path(summary["report"]).is_file()
    close(job_scores(cfg), reference)


@pytest.fixture(scope="module")
def featurised(tmp_path_factory, digits_checkpoints):
    """A store featurised and scored in-process, one intra-op thread (as a score task of one
    CPU), in blocks of 256 train rows: its S and top-k are what the score tasks must give."""
    cfg = small_job(tmp_path_factory.mktemp("here") / "s.zarr", digits_checkpoints)
    scoring = dataclasses.replace(cfg.scoring, train_block=128, block_rows=256, write_scores="full")
    cfg = dataclasses.replace(cfg, scoring=scoring)
    with one_thread():
        assert run_in_process(cfg).scores[0].blocks == 6  # 1500 rows in ranges of 256
    return cfg, *published(cfg)


def published(cfg):
    sset = FeatureStore.open(cfg.store.path, mode="r").score_set("targets", variant_name(P, LAMBDA))
    assert sset is not None, "no published scores"
    return sset.scores(), sset.read_topk()


def rescore_copy(featurised, tmp_path):
    """A copy of the featurised store without its scores: a launch scores it again."""
    cfg = featurised[0]
    shutil.copytree(cfg.store.path, tmp_path / "s.zarr", ignore=shutil.ignore_patterns("scores"))
    store = dataclasses.replace(cfg.store, path=str(tmp_path / "s.zarr"))
    return dataclasses.replace(cfg, store=store)


def same_bits(cfg, s, top):
    s_got, top_got = published(cfg)
    np.testing.assert_array_equal(s_got, s)
    for key, value in top.items():
        np.testing.assert_array_equal(top_got[key], value)


def blocks_of(jobs):
    return [(r.task.row_range, r.task.super_block, r.worker) for j in jobs for r in j.result()]


def test_array_mode_scores_blocks_as_array_tasks(slurm, tmp_path, featurised, monkeypatch):
    """Reduce, then 3 score tasks of 2 blocks each, then the merge: the in-process bits."""
    monkeypatch.chdir(ROOT)
    cfg = rescore_copy(featurised, tmp_path)
    sub = submit_array(cfg, tmp_path / "jobs", partition=slurm, timeout_min=10, score_tasks=3)
    assert sub.shards == [] and len(sub.scores) == 3  # every chunk was committed
    summary = sub.merge.result()
    blocks = blocks_of(sub.scores)
    assert sorted((r, s) for r, s, _ in blocks) == [(r, 0) for r in range(6)]
    assert len({w for _, _, w in blocks}) == 3  # one process per task
    scoring = summary["variants"][0]["scoring"]
    assert (scoring["blocks"], scoring["blocks_computed"], scoring["blocks_reused"]) == (6, 6, 0)
    same_bits(cfg, *featurised[1:])


def test_a_cancelled_score_task_is_all_a_rerun_computes(slurm, tmp_path, featurised, monkeypatch):
    """scancel of one score task (while it waits for the reduce job): the other tasks commit
    their blocks, the merge job is cancelled with it (never pending for ever), nothing is
    published; the same launch again computes only the cancelled task's blocks."""
    monkeypatch.chdir(ROOT)
    cfg = rescore_copy(featurised, tmp_path)
    first = submit_array(cfg, tmp_path / "jobs", partition=slurm, timeout_min=10, score_tasks=3)
    first.scores[1].cancel()
    kept = blocks_of([first.scores[0], first.scores[2]])
    assert len(kept) == 4
    deadline = time.time() + 120
    while True:
        first.merge.get_info(mode="force")
        if first.merge.state not in ("PENDING", "UNKNOWN"):
            break
        assert time.time() < deadline, f"the merge job is still {first.merge.state}"
        time.sleep(1)
    assert first.merge.state.startswith("CANCELLED")
    assert FeatureStore.open(cfg.store.path).score_set("targets", variant_name(P, LAMBDA)) is None
    blocks = pending(first.reduce.result()["prepare"])
    cancelled = {(t.row_range, t.super_block) for t in share(blocks, 1, 3)}
    assert len(cancelled) == 2

    again = submit_array(cfg, tmp_path / "jobs", partition=slurm, timeout_min=10, score_tasks=3)
    summary = again.merge.result()
    assert {(r, s) for r, s, _ in blocks_of(again.scores)} == cancelled
    scoring = summary["variants"][0]["scoring"]
    assert (scoring["blocks_computed"], scoring["blocks_reused"]) == (2, 4)
    same_bits(cfg, *featurised[1:])


def test_array_mode_with_the_kronecker_projection(slurm, tmp_path, tmp_path_factory, monkeypatch):
    """The array route's plain Workers write the same Kronecker features as an in-process run."""

    monkeypatch.chdir(ROOT)
    cache = tmp_path_factory.mktemp("cache")
    checkpoints = digits.checkpoints(num=1, epochs=3, cache_dir=str(cache), hidden=WIDE)
    reference = kron_job(tmp_path / "ref.zarr", checkpoints)
    run_in_process(reference)
    cfg = kron_job(tmp_path / "s.zarr", checkpoints)
    sub = submit_array(cfg, tmp_path / "jobs", tasks=2, partition=slurm, timeout_min=10)
    sub.merge.result()
    assert sum(sum(j.result().rows_computed.values()) for j in sub.shards) == 1500 + 297
    x, s = stored_features(cfg)
    x_ref, s_ref = stored_features(reference)
    np.testing.assert_array_equal(x, x_ref)
    close(s, s_ref)  # the reduce job sums XᵀX from the store, in another order


def test_array_mode_attributes_an_llm_as_the_readme_command_does(slurm, tmp_path, monkeypatch):
    """The README's "Attribute your LLM" command (checkpoint directories, JSONL) as SLURM array
    tasks: the scores of the traker-style Python API on the same tokenised batches."""
    from tests.hf.test_llm_cli import SMALL, api_scores, readme_commands

    ckpts = llm_models.checkpoints(tmp_path, "llama")
    attribute, _ = readme_commands()
    monkeypatch.chdir(tmp_path)  # the README's relative paths
    monkeypatch.setenv("PYTHONPATH", str(ROOT))  # the jobs import launch/ from the checkout
    cfg = compose_job([*attribute, *SMALL])
    sub = submit_array(cfg, tmp_path / "jobs", tasks=2, partition=slurm, timeout_min=10)
    sub.merge.result()
    assert sum(sum(j.result().rows_computed.values()) for j in sub.shards) == 3 * (40 + 6)
    store = FeatureStore.open(cfg.store.path, mode="r")
    sset = store.score_set(cfg.scoring.exp_name, variant_name(cfg.proj_dim, cfg.lambda_reg))
    assert sset is not None
    close(sset.scores(), api_scores(tmp_path, ckpts))


def test_ray_mode_runs_a_cluster_inside_the_allocation(
    slurm, tmp_path, digits_checkpoints, reference, monkeypatch
):
    monkeypatch.chdir(ROOT)
    for key, value in LOOPBACK_ENV.items():  # sbatch exports the environment to the job
        monkeypatch.setenv(key, value)
    cfg = small_job(tmp_path / "s.zarr", digits_checkpoints, shard_rows=256)
    port = free_port()
    job = submit_ray(
        cfg,
        tmp_path / "jobs",
        nodes=1,
        cpus_per_node=2,
        mem_gb=8,
        partition=slurm,
        port=port,
        head_ip="127.0.0.1",
        timeout_min=10,
    )
    summary = job.result()
    assert summary["nodes"] == 1 and summary["rows_computed"]["train"] == 2 * 1500
    close(job_scores(cfg), reference)
    deadline = time.time() + 120  # the result exists before SLURM has recorded the job's end
    while True:
        job.get_info(mode="force")
        if job.state not in ("PENDING", "RUNNING", "COMPLETING", "UNKNOWN"):
            break
        assert time.time() < deadline, f"the job is still {job.state}"
        time.sleep(1)
    assert job.state == "COMPLETED"
    assert ray_left(port) == []  # nothing of the job's Ray survives it


def test_ray_mode_reports_the_driver_s_own_error(slurm, tmp_path, digits_checkpoints, monkeypatch):
    """A job that fails on the allocation (a truncated checkpoint, read first by the workers)
    ends with that error as the job's last line, as a local run prints it; before, the head's
    cleanup raised FileNotFoundError for its report folder, which the job never made, and hid
    it."""
    monkeypatch.chdir(ROOT)
    for key, value in LOOPBACK_ENV.items():
        monkeypatch.setenv(key, value)
    torn = tmp_path / "torn.pt"
    data = digits_checkpoints[0].read_bytes()
    torn.write_bytes(data[: len(data) // 2])
    cfg = small_job(tmp_path / "s.zarr", [torn], shard_rows=256)
    port = free_port()
    job = submit_ray(
        cfg,
        tmp_path / "jobs",
        cpus_per_node=2,
        partition=slurm,
        port=port,
        head_ip="127.0.0.1",
        timeout_min=10,
    )
    with pytest.raises(submitit.core.utils.FailedJobError) as e:
        job.result()
    assert f"checkpoint {torn} could not be loaded" in failures.last_error_line(str(e.value))
    assert ray_left(port) == []  # the failed mark left the head's `ray start` running for good


def ray_left(port: int) -> list[str]:
    """The command lines of the job's `ray start` and GCS (both name its port) still running
    30 s after the job (`ray start --block` stops its daemons on SIGTERM within seconds)."""
    deadline = time.time() + 30
    while True:
        found = subprocess.run(
            ["pgrep", "-af", f"(--port|--gcs_server_port)={port}( |$)"],
            capture_output=True,
            text=True,
        ).stdout.splitlines()
        if not found or time.time() > deadline:
            return found
        time.sleep(1)


def test_ray_mode_evaluates_inside_the_allocation(slurm, tmp_path, digits_checkpoints, monkeypatch):
    """`python -m launch.slurm ray --eval`: the LDS's subset models as Ray tasks of the job."""
    import dataclasses

    from trak_dist.config import EvalConfig

    monkeypatch.chdir(ROOT)
    for key, value in LOOPBACK_ENV.items():
        monkeypatch.setenv(key, value)
    store = tmp_path / "s.zarr"
    traker_scores(store, digits_checkpoints)  # features and scores p64_lambda0.01
    cfg = dataclasses.replace(
        small_job(store, digits_checkpoints),
        eval=EvalConfig(num_models=6, recipe_kwargs={"epochs": 2}, bootstrap=50),
    )
    job = submit_ray(
        cfg,
        tmp_path / "jobs",
        cpus_per_node=2,
        partition=slurm,
        port=free_port(),
        head_ip="127.0.0.1",
        timeout_min=10,
        drive=evaluate_and_report,
    )
    summary = job.result()
    assert (summary["trained"], summary["reused"]) == (6, 0)
    (variant,) = summary["variants"]
    assert variant["variant"] == f"p{P}_lambda{LAMBDA:g}" and variant["models"] == 6
    assert -1 <= variant["low"] <= variant["lds"] <= variant["high"] <= 1
    assert FeatureStore.open(store).eval_set("targets").done().all()
    assert Path(summary["report"]).is_file()


def test_hydra_submitit_launcher_sweep_featurises_once(slurm, tmp_path, digits_checkpoints):
    ckpts = ",".join(str(c) for c in digits_checkpoints)
    cmd = [
        sys.executable,
        "-c",
        "from trak_dist.cli import main; main()",
        "-m",
        "hydra/launcher=submitit_slurm",
        f"hydra.launcher.partition={slurm}",
        "hydra.launcher.timeout_min=10",
        "hydra.launcher.mem_gb=4",
        "hydra.launcher.cpus_per_task=1",
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
        "proj_dim=32,64",
        f"lambda_reg={LAMBDA}",
        f"store.path={tmp_path / 's.zarr'}",
        f"model.checkpoints=[{ckpts}]",
        f"store.chunk_rows={CHUNK}",
        "progress=false",
        "featurize.half_precision=false",
        "cluster=inprocess",  # each SLURM job runs its stages in its own process: no Ray
    ]
    out = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
        env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    reports = [json.loads(p.read_text()) for p in (tmp_path / "sweep").glob("*/trak_report.json")]
    assert sorted(r["variants"][0]["proj_dim"] for r in reports) == [32, 64]
    featurised = sum(sum(r["rows_computed"].values()) for r in reports)
    assert featurised == 2 * (1500 + 297)  # one featurisation at proj_dim 64 serves both
    assert (tmp_path / "sweep" / "sweep_summary.md").is_file()
    assert len(list((tmp_path / "sweep" / ".submitit").glob("*"))) >= 2  # one job per point


class SlowDigits(Dataset):
    """Digits, 4 ms per item: slow enough to interrupt an array task mid-way."""

    def __init__(self, split: str) -> None:
        self.data = digits.train_set() if split == "train" else digits.target_set()

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i):
        time.sleep(0.004)
        return self.data[i]


def test_requeued_array_task_resumes_from_the_store(
    slurm, tmp_path, digits_checkpoints, reference, monkeypatch
):
    import dataclasses

    from trak_dist.config import DataConfig

    monkeypatch.chdir(ROOT)
    cfg = small_job(tmp_path / "s.zarr", digits_checkpoints, shard_rows=256)
    cfg = dataclasses.replace(
        cfg, data=DataConfig(train=SlowDigits("train"), targets=SlowDigits("targets"))
    )
    sub = submit_array(cfg, tmp_path / "jobs", tasks=1, partition=slurm, timeout_min=10)
    jobs = sub.shards
    rows = FeatureStore.open(cfg.store.path).train_rows(0)
    deadline = time.time() + 120
    while rows.done_chunks().sum() < 2:  # a few chunks committed, most still to do
        assert time.time() < deadline, "the array task never committed a chunk"
        time.sleep(0.2)
    jobs[0]._interrupt()  # preemption: SIGTERM then submitit's USR signal → requeue
    result = jobs[0].result()  # the requeued run's FeaturizeReport
    reused, computed = sum(result.rows_reused.values()), sum(result.rows_computed.values())
    assert reused >= 2 * CHUNK  # it skipped what was committed before
    assert computed + reused == 2 * (1500 + 297)
    sub.merge.result()
    close(job_scores(cfg), reference)
    assert P == 64
