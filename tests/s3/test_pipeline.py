"""Whole jobs with the store on S3: the same bits as on local disk, resumed at chunk and block
granularity, and nothing written beside the store on local disk."""

from __future__ import annotations

import numpy as np
import pytest

from tests.fixtures.pipeline import run_in_process, small_job, stored_features
from trak_dist.store import FeatureStore

pytestmark = pytest.mark.s3


def test_a_job_on_s3_equals_the_local_one_bit_for_bit(
    s3_url, tmp_path, digits_checkpoints, monkeypatch
):
    local = small_job(tmp_path / "local.zarr", digits_checkpoints)
    run_in_process(local)
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    remote = small_job(s3_url, digits_checkpoints)  # type: ignore[arg-type]
    result = run_in_process(remote)
    assert result.store == s3_url
    x_local, s_local = stored_features(local)
    x_remote, s_remote = stored_features(remote)
    np.testing.assert_array_equal(x_remote, x_local)
    np.testing.assert_array_equal(s_remote, s_local)
    assert list(work.iterdir()) == []  # no lock, lease or report beside the store
    again = run_in_process(remote)
    assert sum(again.rows_computed.values()) == 0
    assert FeatureStore.open(s3_url, mode="r").checkpoint_ids() == [0, 1]
