"""Worker and Reducer as plain classes (no Ray): docs/design.md, invariants 2, 3 and 6."""

import numpy as np

from tests.fixtures.pipeline import job_scores, run_in_process, small_job, traker_scores
from trak_dist.pipeline import Worker, prepare
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
    rows.flags.done[5:6] = 0
    third, _ = worker.run(task)
    assert (third.rows_computed, third.rows_reused) == (64, 192)
    np.testing.assert_array_equal(rows.read(task.start, task.end), stored)


def test_a_reused_chunk_that_is_damaged_is_featurised_again_and_a_changed_row_refused(
    tmp_path, digits_checkpoints
):
    import dataclasses

    import pytest
    import torch

    from trak_dist.config import DataConfig
    from trak_dist.errors import StoreMismatchError
    from trak_dist.examples import digits

    cfg = small_job(tmp_path / "c.zarr", digits_checkpoints)
    prep = prepare(cfg)
    worker = Worker(cfg, prep.checkpoints, prep.width)
    task = prep.train_tasks[1]  # rows [256, 512), chunks 4..7
    _, xtx = worker.run(task)
    rows = prep.store.train_rows(task.model_id)
    stored = rows.read(task.start, task.end).copy()
    x_file = tmp_path / "c.zarr" / "train" / "0" / "X" / "c" / "5" / "0"
    data = bytearray(x_file.read_bytes())
    data[7] ^= 0x10
    x_file.write_bytes(bytes(data))
    (tmp_path / "c.zarr" / "train" / "0" / "H" / "c" / "6").unlink()
    again, xtx2 = worker.run(task)
    assert (again.rows_computed, again.rows_reused) == (128, 128)
    np.testing.assert_array_equal(rows.read(task.start, task.end), stored)
    np.testing.assert_array_equal(xtx2, xtx)

    def changed():
        x, y = digits.train_set().tensors
        x = x.clone()
        x[300, 5] = 1.0 - x[300, 5]
        return torch.utils.data.TensorDataset(x, y)

    other = Worker(
        dataclasses.replace(cfg, data=DataConfig(train=changed)), prep.checkpoints, prep.width
    )
    with pytest.raises(StoreMismatchError, match="row 300 differ"):
        other.run(task)
