"""One pipeline, every executor: the in-process executor and Ray give the same store bit for bit;
the run's results are typed; the SLURM array's reduce job (finish_from_store) scores what plain
Workers committed, and its staged scoring (prepare, blocks in shares, merge) gives the same bits;
the imports of the stages run one way."""

import ast
import dataclasses
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import trak_dist
from tests.fixtures.pipeline import (
    LAMBDA,
    P,
    job_scores,
    run_in_process,
    small_job,
    stored_features,
)
from trak_dist.errors import StoreStateError
from trak_dist.pipeline import (
    BlockScorer,
    JobResult,
    Worker,
    finish_from_store,
    merge_from_store,
    prepare,
    prepare_from_store,
)
from trak_dist.scoring import ScoreResult
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

    """The same job (the same shards): only where they ran differs, and the order in which
    two workers' partial XᵀX reached the reducer. One intra-op thread here, as in a Ray worker
    of one CPU (OMP_NUM_THREADS=1): BLAS rounds a small batch's last row differently with two."""
    here = small_job(tmp_path / "here.zarr", digits_checkpoints, workers=2, shard_rows=128)
    ray = small_job(tmp_path / "ray.zarr", digits_checkpoints, workers=2, shard_rows=128)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        local = run_in_process(here)
    finally:
        torch.set_num_threads(threads)
    remote = run_job(ray)
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


def test_staged_scoring_gives_the_bits_of_one_process_and_resumes(tmp_path, digits_checkpoints):
    """SLURM's scoring stages without SLURM: prepare, blocks in shares (in any order), merge.
    A launch that ran one share of three and stopped leaves those blocks committed; the next
    prepares only the others, and the merged S and top-k are the in-process run's bits."""
    cfg = small_job(tmp_path / "s.zarr", digits_checkpoints)
    scoring = dataclasses.replace(cfg.scoring, train_block=128, block_rows=256, write_scores="full")
    cfg = dataclasses.replace(cfg, scoring=scoring)
    run_in_process(cfg)
    sset = FeatureStore.open(cfg.store.path, mode="r").score_set("targets", variant_name(P, LAMBDA))
    s_ref, top_ref = sset.scores(), sset.read_topk()
    shutil.rmtree(tmp_path / "s.zarr" / "scores")

    first = prepare_from_store(cfg, 2, [(P, LAMBDA)])
    assert len(first.blocks) == 6  # 1500 rows in ranges of 256, one super-block
    scorer = BlockScorer(cfg.store.path)
    ran = [scorer.run(t) for t in first.share(1, 3)]  # then the launch stops
    assert all(scorer.committed(t) for t in first.share(1, 3))
    again = prepare_from_store(cfg, 2, [(P, LAMBDA)])
    assert again.blocks == first.share(0, 3) + first.share(2, 3)
    with pytest.raises(StoreStateError, match=r"4 of 6 score blocks .* not committed"):
        merge_from_store(cfg, first, ran)  # the first launch's merge would stop here
    results = [scorer.run(t) for i in (1, 0) for t in again.share(i, 2)]  # the set was kept
    result = merge_from_store(cfg, again, results).scores[0]
    assert (result.blocks, result.blocks_computed, result.blocks_reused) == (6, 4, 2)
    published = FeatureStore.open(cfg.store.path, mode="r").score_set(
        "targets", variant_name(P, LAMBDA)
    )
    np.testing.assert_array_equal(published.scores(), s_ref)
    for key, value in top_ref.items():
        np.testing.assert_array_equal(published.read_topk()[key], value)


def imported_modules(package: Path) -> dict[str, set[str]]:
    """Every module each source file of ``package`` imports (absolute names)."""
    found = {}
    for path in package.rglob("*.py"):
        names = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names.add(node.module)
        found[str(path.relative_to(package.parent))] = names
    return found


@pytest.mark.parametrize(
    ("package", "forbidden"),
    [
        # the stages know nothing of their executors
        ("pipeline", ("ray", "hydra", "submitit", "trak_dist.distributed", "trak_dist.launch")),
        # the math and the store know nothing of orchestration
        ("scoring", ("ray", "submitit", "trak_dist.pipeline", "trak_dist.distributed")),
        ("store", ("ray", "submitit", "trak_dist.pipeline", "trak_dist.distributed")),
    ],
)
def test_imports_run_one_way(package, forbidden):
    root = Path(trak_dist.__file__).parent / package
    bad = {
        (path, name)
        for path, names in imported_modules(root).items()
        for name in names
        if any(name == f or name.startswith(f + ".") for f in forbidden)
    }
    assert not bad


def test_the_pipeline_package_loads_without_ray():
    code = "import sys, trak_dist.pipeline; print('ray' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
