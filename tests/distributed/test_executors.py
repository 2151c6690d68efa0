"""One pipeline, every executor: the in-process executor and Ray give the same store bit for bit;
the run's results are typed; the SLURM array's reduce job (finish_from_store) scores what plain
Workers committed."""

import dataclasses

import numpy as np
import pytest
from pipeline import LAMBDA, P, job_scores, run_in_process, small_job, stored_features

from trak_dist.errors import StoreStateError
from trak_dist.pipeline import (
    JobResult,
    ScoreRequest,
    ScoreResult,
    Worker,
    finish_from_store,
    prepare,
)
from trak_dist.store import FeatureStore, variant_name

N_TRAIN, N_TARGETS = 1500, 297


def xtx(cfg):
    store = FeatureStore.open(cfg.store.path, mode="r")
    return np.stack([store.read_xtx(m) for m in store.checkpoint_ids()])


@pytest.mark.ray
@pytest.mark.slow
def test_in_process_and_ray_executors_write_the_same_store(
    ray_session, tmp_path, digits_checkpoints
):
    from trak_dist.distributed import run_job

    here = small_job(tmp_path / "here.zarr", digits_checkpoints, workers=1, shard_rows=256)
    ray = small_job(tmp_path / "ray.zarr", digits_checkpoints, workers=2, shard_rows=128)
    local, remote = run_in_process(here), run_job(ray)
    x_here, s_here = stored_features(here)
    x_ray, s_ray = stored_features(ray)
    np.testing.assert_array_equal(x_ray, x_here)
    np.testing.assert_array_equal(xtx(ray), xtx(here))
    np.testing.assert_array_equal(s_ray, s_here)
    assert remote.rows_computed == local.rows_computed
    assert [s.lambdas for s in remote.scores] == [s.lambdas for s in local.scores]
    np.testing.assert_array_equal(
        remote.scores[0].top.proponents_idx, local.scores[0].top.proponents_idx
    )


def test_results_are_typed_and_a_rerun_reuses_everything(tmp_path, digits_checkpoints):
    cfg = small_job(tmp_path / "s.zarr", digits_checkpoints)
    first = run_in_process(cfg)
    assert isinstance(first, JobResult)
    assert (first.n, first.m, first.checkpoints, first.proj_dim) == (N_TRAIN, N_TARGETS, 2, P)
    assert first.rows_computed == {"train": 2 * N_TRAIN, "target": 2 * N_TARGETS}
    assert first.rows_reused == {"train": 0, "target": 0}
    (score,) = first.scores
    assert isinstance(score, ScoreResult)
    assert score.variant == variant_name(P, LAMBDA) and score.lambdas == (LAMBDA, LAMBDA)
    assert score.path.endswith(f"/scores/targets/{score.variant}")
    stored = FeatureStore.open(cfg.store.path, mode="r").score_set("targets", score.variant)
    top = stored.read_topk()
    assert score.top.proponents_idx.shape == (100, 10)
    np.testing.assert_array_equal(score.top.proponents_idx, top["proponents_idx"][:100])
    np.testing.assert_array_equal(score.top.opponents_val, top["opponents_val"][:100])
    assert set(first.conditioning) == {0, 1} and all(c[P] > 1 for c in first.conditioning.values())
    with pytest.raises(dataclasses.FrozenInstanceError):
        score.variant = "other"  # type: ignore[misc]
    scores = job_scores(cfg)
    # the plan leaves out checkpoints with XᵀX and committed targets: all reused, same bits
    again = run_in_process(cfg)
    assert again.rows_computed == {"train": 0, "target": 0}
    assert again.rows_reused == {"train": 2 * N_TRAIN, "target": 2 * N_TARGETS}
    np.testing.assert_array_equal(job_scores(cfg), scores)
    assert ScoreRequest.of(cfg, [0, 1], P, LAMBDA) == ScoreRequest(
        "targets", (0, 1), P, LAMBDA, "mean_abs", 10, 4096, 1024
    )


def test_finish_from_store_scores_what_plain_workers_committed(tmp_path, digits_checkpoints):
    """The SLURM array's route without SLURM: Workers commit rows (no partial XᵀX kept), then
    the dependent job's reduce → factorise → score."""
    reference = small_job(tmp_path / "ref.zarr", digits_checkpoints)
    run_in_process(reference)
    cfg = small_job(tmp_path / "s.zarr", digits_checkpoints)
    prep = prepare(cfg)
    worker = Worker(cfg, prep.checkpoints, prep.width)
    for task in prep.train_tasks[1:] + prep.target_tasks:
        worker.run(task)
    with pytest.raises(StoreStateError, match=r"model_id=0: 4 chunks of train rows"):
        finish_from_store(cfg, 2, [(P, LAMBDA)])  # the first shard (4 chunks) is missing
    worker.run(prep.train_tasks[0])
    result = finish_from_store(cfg, 2, [(P, LAMBDA)])
    assert result.scores[0].variant == variant_name(P, LAMBDA)
    x, s = stored_features(cfg)
    x_ref, s_ref = stored_features(reference)
    np.testing.assert_array_equal(x, x_ref)
    # XᵀX summed from the store in one block, not from shard partials: float64 rounding only
    np.testing.assert_allclose(xtx(cfg), xtx(reference), rtol=1e-12)
    np.testing.assert_allclose(s, s_ref, rtol=1e-5, atol=1e-5 * np.abs(s_ref).max())
