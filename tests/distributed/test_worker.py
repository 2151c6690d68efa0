"""Worker and Reducer as plain classes (no Ray): invariants 2, 3 and 6."""

import numpy as np
from pipeline import job_scores, run_in_process, small_job, traker_scores

from trak_dist.distributed import Worker
from trak_dist.distributed._prepare import prepare
from trak_dist.scoring import gram


def test_plain_classes_equal_the_traker_api(tmp_path, digits_checkpoints):
    cfg = small_job(tmp_path / "a.zarr", digits_checkpoints)
    run_in_process(cfg)
    reference = traker_scores(tmp_path / "ref.zarr", digits_checkpoints)
    np.testing.assert_allclose(
        job_scores(cfg), reference, rtol=1e-4, atol=1e-5 * np.abs(reference).max()
    )


def test_partial_gram_matches_the_store_and_committed_chunks_are_reused(
    tmp_path, digits_checkpoints
):
    cfg = small_job(tmp_path / "b.zarr", digits_checkpoints)
    prep = prepare(cfg)
    worker = Worker(cfg, prep.checkpoints, prep.width)
    task = prep.train_tasks[1]  # rows [256, 512)
    first, xtx = worker.run(task)
    assert (first.rows_computed, first.rows_reused) == (256, 0)
    rows = prep.store.train_rows(task.model_id)
    np.testing.assert_allclose(xtx, gram(rows.read(task.start, task.end)), rtol=1e-12)
    stored = rows.read(task.start, task.end).copy()
    again, xtx2 = worker.run(task)
    assert (again.rows_computed, again.rows_reused) == (0, 256)
    np.testing.assert_array_equal(xtx2, xtx)
    # a chunk recomputed after its flag is lost holds the same bytes
    rows._done[5:6] = 0
    third, _ = worker.run(task)
    assert (third.rows_computed, third.rows_reused) == (64, 192)
    np.testing.assert_array_equal(rows.read(task.start, task.end), stored)
