"""By hand (over CI's budget: ``python -m pytest benchmarks/remote_checks/multinode``). Jobs
submitted from outside a three-node cluster with no shared file system: the store, the
report, the LM's checkpoints and data on S3. Their results equal the single-node local-disk
run's bit for bit (issue 27)."""

from __future__ import annotations

import json
import time

import pytest

from tests.fixtures.multinode import fresh, wait_for
from tests.multinode._jobs import LM_TRAIN_ROWS, assert_same_bits, lm_args

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.multinode]
DIGITS = {"train": 3 * 1500, "target": 3 * 297}


def committed_rows(cluster, store_key: str) -> int:
    """Row chunks committed to the store (their flags: ``<row set>/done/c/<chunk>``)."""
    return sum("/done/c/" in k for k in cluster.keys(f"{store_key}/"))


def test_the_default_job_on_three_nodes_with_the_store_on_s3_equals_the_local_run(
    cluster, s3_client, tmp_path
):
    c, local = cluster
    store = c.url(f"{fresh()}/default.zarr")
    job = c.submit([f"store.path={store}", "progress=false"], tmp_path / "job.log")
    out = job.wait()
    assert job.proc.returncode == 0, out[-5000:]
    # the code travelled with the job: the nodes' Python has no trak_dist
    assert "Creating a file package for local module" in out
    report = c.read_json(job.report_url().removesuffix(".md") + ".json")
    assert report["store"] == store
    assert (report["rows_computed"], report["worker_restarts"]) == (DIGITS, 0)
    # workers on more than one node (one per node's CPU is asked for; on a loaded machine the
    # last node's may still be starting, its working_dir unpacked, when the shards run out)
    ips = set(c.actor_ips(job, "Worker"))
    assert len(ips) >= 2 and c.conf["HEAD_IP"] in ips, ips
    assert job.report_url().startswith(f"{store}.reports/")
    assert assert_same_bits(local.store("default"), store) == {"checkpoints": 3, "variants": 1}
    # the S3 secret is in the nodes' environment only: never in the output or the report
    assert c.secret not in out and c.secret not in json.dumps(report)


def test_a_causal_lm_job_with_inputs_on_s3_outlives_15_s_without_s3_and_equals_the_local_run(
    cluster, s3_client, lm_inputs, tmp_path
):
    """Checkpoints (``save_pretrained`` directories) and JSONL data on S3, fetched by every node
    into its own cache; the S3 server stopped for 15 s once the first chunk is committed."""
    c, local = cluster
    run = fresh()
    for name in ("c0", "c1", "train.jsonl", "targets.jsonl"):
        c.upload(lm_inputs / name, f"{run}/inputs/{name}")
    store = c.url(f"{run}/lm.zarr")
    job = c.submit([*lm_args(c.url(f"{run}/inputs")), f"store.path={store}"], tmp_path / "job.log")
    wait_for("a committed chunk", lambda: committed_rows(c, f"{run}/lm.zarr"), job=job)
    c.s3("stop")
    time.sleep(15)
    assert job.running(), f"the job ended while S3 was down:\n{job.text()[-4000:]}"
    c.s3("start")
    out = job.wait()
    assert job.proc.returncode == 0, out[-5000:]
    report = c.read_json(job.report_url().removesuffix(".md") + ".json")
    rows = {"train": 2 * LM_TRAIN_ROWS, "target": 2 * 6}
    assert report["rows_computed"] == rows, report["rows_computed"]
    assert assert_same_bits(local.store("lm"), store) == {"checkpoints": 2, "variants": 1}
