"""By hand (over CI's budget: ``python -m pytest benchmarks/remote_checks/multinode``): the head
node lost (every process of it) while scoring on the three-node cluster, the store on S3; the
rerun on a new head recomputes only what was not committed and equals the local run bit for bit
(issue 27)."""

from __future__ import annotations

import pytest

from tests.fixtures.multinode import fresh, wait_for
from tests.multinode._jobs import FAULTS, assert_same_bits
from tests.multinode.test_node_loss import BLOCKS, DIGITS, committed_blocks, report_of

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.multinode]


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
