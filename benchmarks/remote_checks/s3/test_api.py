"""The Python side against a store on S3: TRAKer processes featurising into one ``save_dir``
URL, a serve replica's index loaded from S3, and ``trak-dist eval``'s subset models stored
there."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import uuid
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.fixtures.pipeline import LAMBDA, P, run_in_process, small_job
from tests.fixtures.s3 import S3Server
from tests.fixtures.traker_jobs import N, make_model, noop_kwargs
from tests.fixtures.traker_jobs import train_states as _train_states
from trak_dist import TRAKer
from trak_dist.config import ClusterConfig, EvalConfig, ServeConfig
from trak_dist.store import FeatureStore, variant_name
from trak_dist.store.verify import verify

pytestmark = pytest.mark.s3
JOBS = Path(__file__).parents[3] / "tests" / "fixtures" / "traker_jobs.py"


@pytest.fixture(scope="module")
def s3_job(s3_server: S3Server, s3_checkpoints: list[str]):
    """``small_job`` with its store and checkpoints on S3, run in process."""
    cfg = small_job(s3_server.url(f"api-{uuid.uuid4().hex[:8]}/store.zarr"), s3_checkpoints)  # type: ignore[arg-type]
    run_in_process(cfg)
    return cfg


def shard_jobs(save_dir: str, ckpt_dir: Path) -> None:
    """traker_jobs' ``shard`` job in 3 processes at once (rows split at 97 and 211)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = [
        subprocess.Popen(
            [sys.executable, str(JOBS), "shard", str(k), save_dir, str(ckpt_dir)],
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for k in range(3)
    ]
    for p in procs:
        _, err = p.communicate(timeout=600)
        assert p.returncode == 0, err[-3000:]


def gathered(save_dir: str) -> np.ndarray:
    t = TRAKer(
        model=make_model(), task="image_classification", train_set_size=N, save_dir=save_dir,
        chunk_rows=64, **noop_kwargs(),
    )  # fmt: skip
    return np.asarray(t.finalize_scores(exp_name="exp"))


@pytest.mark.slow
def test_traker_processes_featurise_into_one_s3_store(s3_url, tmp_path):
    ckpt_dir = tmp_path / "ckpts"
    ckpt_dir.mkdir()
    for i, st in enumerate(_train_states()):
        torch.save(st, ckpt_dir / f"ckpt_{i}.pt")
    shard_jobs(s3_url, ckpt_dir)
    shard_jobs(str(tmp_path / "local.zarr"), ckpt_dir)
    report = verify(s3_url)  # what the processes left (committed or staged rows) is sound
    assert report.problems == [] and report.chunks_checked > 0
    np.testing.assert_array_equal(gathered(s3_url), gathered(str(tmp_path / "local.zarr")))


def test_a_serve_replica_loads_its_index_from_s3(s3_job):
    from trak_dist.examples import digits
    from trak_dist.serve._attributor import Attributor

    cfg = dataclasses.replace(s3_job, serve=ServeConfig(block_rows=512, featurize_batch=64))
    att = Attributor(cfg)
    targets = digits.target_set()
    picks = list(range(0, 297, 37))
    top = att.attribute([targets[i] for i in picks], k=10)
    store = FeatureStore.open(cfg.store.path, mode="r")
    sset = store.score_set("targets", variant_name(P, LAMBDA))
    assert sset is not None
    stored = sset.read_topk()
    np.testing.assert_array_equal(np.asarray(top.proponents_idx), stored["proponents_idx"][picks])


@pytest.mark.ray
def test_eval_stores_its_subset_models_on_s3(ray_session, s3_job):
    from trak_dist.distributed.eval_driver import run_eval
    from trak_dist.lds import store_lds

    cfg = dataclasses.replace(
        s3_job,
        eval=EvalConfig(num_models=4, recipe_kwargs={"epochs": 2}, bootstrap=20),
        cluster=ClusterConfig(num_workers=2),
    )
    run = run_eval(cfg)
    assert (run.trained, run.reused) == (4, 0)
    store = FeatureStore.open(cfg.store.path, mode="r")
    (row,) = store_lds(store, "targets", [variant_name(P, LAMBDA)], bootstrap=0)
    assert row.result.models == 4 and np.isfinite(row.result.lds)
    assert run_eval(cfg).reused == 4  # read back from S3, not retrained
