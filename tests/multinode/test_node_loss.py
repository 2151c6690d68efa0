"""Nodes lost in the middle of a job on the three-node cluster, the store on S3: worker nodes
(their raylet SIGKILLed) while featurising and while scoring, then the head node (every process
of it). The results equal the local run's bit for bit, the report counts what was replaced, and
after a lost head the rerun on a new head recomputes only what was not committed (issue 27)."""

from __future__ import annotations

import pytest

from tests.fixtures.multinode import fresh, wait_for
from tests.multinode._jobs import FAULTS, assert_same_bits

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.multinode]
DIGITS = {"train": 3 * 1500, "target": 3 * 297}
BLOCKS = 24  # score blocks of FAULTS: 1500 train rows in blocks of 64, all 297 targets in one


def committed_blocks(cluster, store_key: str) -> int:
    """Score blocks committed to the unfinished score set (one flag object each; on an object
    store the unfinished set is the variant itself, completed by a flag written last)."""
    return sum("/parts/done/c/" in k for k in cluster.keys(f"{store_key}/scores/"))


def report_of(cluster, job) -> dict:
    return cluster.read_json(job.report_url().removesuffix(".md") + ".json")


def test_the_head_node_lost_while_scoring_and_a_new_head_resumes_from_s3(
    cluster, s3_client, tmp_path
):
    """Every process of the head (GCS, driver, reducer) SIGKILLed once score blocks are
    committed; the worker nodes are stopped too (their GCS is gone), then a new cluster runs
    the same command: it reuses every committed row and block from S3 and computes the rest."""
    c, local = cluster
    key = f"{fresh()}/lost-head.zarr"
    # a killed job's store lease expires after lease_ttl unrenewed: 10 s instead of 60
    args = [*FAULTS, f"store.path={c.url(key)}", "+store.options.lease_ttl=10"]
    job = c.submit(args, tmp_path / "killed.log")
    try:
        wait_for("4 committed score blocks", lambda: committed_blocks(c, key) >= 4, job=job)
        c.kill(1, "all")
        for k in (2, 3):
            c.node("stop", str(k))
    finally:
        job.proc.kill()  # the client, which lost its head too
        job.proc.wait(30)
    committed = committed_blocks(c, key)
    assert 0 < committed < BLOCKS, f"{committed} of {BLOCKS} blocks committed at the kill"
    c.restart(1, 2, 3)
    again = c.submit(args, tmp_path / "rerun.log")
    out = again.wait()
    assert again.proc.returncode == 0, out[-5000:]
    report = report_of(c, again)
    (variant,) = report["variants"]
    assert (report["rows_computed"], report["rows_reused"]) == ({"train": 0, "target": 0}, DIGITS)
    sc = variant["scoring"]
    assert (sc["blocks"], sc["blocks_reused"], sc["blocks_computed"]) == (
        BLOCKS,
        committed,
        BLOCKS - committed,
    )
    assert assert_same_bits(local.store("faults"), c.url(key)) == {"checkpoints": 3, "variants": 1}


def test_worker_nodes_lost_while_featurising_and_while_scoring(cluster, s3_client, tmp_path):
    """Node 3's raylet is killed while its worker runs a shard, node 2's while its worker scores
    a block: each time the GCS declares the node dead (~3 s), the driver replaces the worker on
    a node that is left and reruns what was lost."""
    c, local = cluster
    store = c.url(f"{fresh()}/lost-workers.zarr")
    job = c.submit([*FAULTS, f"store.path={store}"], tmp_path / "job.log")
    wait_for("a shard running on node 3", lambda: c.busy(3, "Worker.run"), job=job)
    c.kill(3, "raylet")
    wait_for("a score block on node 2", lambda: c.busy(2, "BlockScorer.run"), job=job)
    c.kill(2, "raylet")
    out = job.wait()  # the next test that needs them restarts nodes 2 and 3 (heal)
    assert job.proc.returncode == 0, out[-5000:]
    report = report_of(c, job)
    (variant,) = report["variants"]
    assert report["worker_restarts"] >= 1, report  # featurisation
    assert variant["scoring"]["worker_restarts"] >= 1, variant["scoring"]
    assert report["rows_computed"] == DIGITS  # a rerun shard recomputes only uncommitted chunks
    assert assert_same_bits(local.store("faults"), store) == {"checkpoints": 3, "variants": 1}
