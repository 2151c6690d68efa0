"""The S3 server stopped in the middle of a job: for 15 s (retried with backoff, the job
finishes with the same bits) and for good (one line naming the store, nothing half committed,
the rerun resumes)."""

from __future__ import annotations

import dataclasses
import threading
import time

import numpy as np
import pytest

from tests.fixtures.pipeline import small_job, stored_features
from trak_dist.errors import RemoteStoreError
from trak_dist.pipeline import InProcessExecutor, run_pipeline
from trak_dist.store import FeatureStore

pytestmark = pytest.mark.s3
OUTAGE_S = 15.0


def with_options(cfg, **options):
    return dataclasses.replace(cfg, store=dataclasses.replace(cfg.store, options=options))


def test_a_15s_outage_is_ridden_out(s3_url, s3_server, digits_checkpoints, local_reference):
    remote = with_options(small_job(s3_url, digits_checkpoints, workers=1), retry_timeout=60)
    outage: list[float] = []

    def restart() -> None:
        time.sleep(OUTAGE_S)
        s3_server.start()
        outage.append(time.monotonic())

    def stop_once(_: object) -> None:
        if not outage:
            outage.append(time.monotonic())
            s3_server.stop()
            threading.Thread(target=restart, daemon=True).start()

    t0 = time.monotonic()
    result = run_pipeline(remote, InProcessExecutor(), on_shard=stop_once)
    assert len(outage) == 2 and outage[1] - outage[0] >= OUTAGE_S
    assert time.monotonic() - t0 > OUTAGE_S  # it waited for the server, then finished
    assert result.rows_computed["train"] == 2 * 1500
    for a, b in zip(stored_features(remote), local_reference, strict=True):
        np.testing.assert_array_equal(a, b)


def test_a_server_gone_for_good_is_one_error_and_the_rerun_resumes(
    s3_url, s3_server, digits_checkpoints, local_reference
):
    remote = with_options(small_job(s3_url, digits_checkpoints, workers=1), retry_timeout=3)
    shards: list[int] = []

    def stop_after_two(_: object) -> None:
        shards.append(1)
        if len(shards) == 2:
            s3_server.stop()

    try:
        with pytest.raises(RemoteStoreError) as e:
            run_pipeline(remote, InProcessExecutor(), on_shard=stop_after_two)
    finally:
        s3_server.start()
    message = str(e.value)
    assert message.startswith(f"the object store {s3_url} failed to ")
    assert "not reachable at http://127.0.0.1:" in message and "rerun the same command" in message
    assert "\n" not in message and s3_server.env()["AWS_SECRET_ACCESS_KEY"] not in message
    # committed before the outage: two shards' chunks, each whole and checked
    store = FeatureStore.open(s3_url, mode="r")
    done = store.train_rows(0).flags.committed()
    assert done.sum() == 2 * 256 // 64
    resumed = run_pipeline(remote, InProcessExecutor())
    assert resumed.rows_reused["train"] == 2 * 256
    for a, b in zip(stored_features(remote), local_reference, strict=True):
        np.testing.assert_array_equal(a, b)
