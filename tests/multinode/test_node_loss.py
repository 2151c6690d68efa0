"""Nodes lost in the middle of a job on the three-node cluster, the store on S3: a worker node
(every process of it SIGKILLed) while featurising, another likewise while scoring. The results
equal the local run's bit for bit and the report counts what was replaced (issue 27). The head
node lost while scoring is checked by hand
(``benchmarks/remote_checks/multinode/test_head_loss.py``: ~4 minutes)."""

from __future__ import annotations

import pytest

from tests.fixtures.multinode import fresh, wait_for
from tests.multinode._jobs import FAULTS, assert_same_bits

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.multinode]
DIGITS = {"train": 3 * 1500, "target": 3 * 297}
SHARD = 64  # rows of a FAULTS shard: at most its chunks are committed by the lost worker
BLOCKS = 24  # score blocks of FAULTS: 1500 train rows in blocks of 64, all 297 targets in one


def committed_blocks(cluster, store_key: str) -> int:
    """Score blocks committed to the unfinished score set (one flag object each; on an object
    store the unfinished set is the variant itself, completed by a flag written last)."""
    return sum("/parts/done/c/" in k for k in cluster.keys(f"{store_key}/scores/"))


def shard_node(cluster) -> int | None:
    """Node 2 or 3 while its worker runs a shard, else None."""
    return next((k for k in (2, 3) if cluster.busy(k, "Worker.run")), None)


def report_of(cluster, job) -> dict:
    return cluster.read_json(job.report_url().removesuffix(".md") + ".json")


def test_worker_nodes_lost_while_featurising_and_while_scoring(cluster, s3_client, tmp_path):
    """The first of nodes 2 and 3 seen running a shard is killed whole (every process), the
    other likewise while its worker scores a block: each time the GCS declares the node dead
    (~3 s), the driver replaces the worker on a node that is left and reruns what was lost.

    Either node may be the one featurising: on a loaded machine the last worker to come up can
    find the shards gone (featurisation lasts ~7 s; CI 2026-12-07 never saw node 3 run one).

    Each node loses every process, not only its raylet: a worker outlives its raylet by up to a
    second (Ray's core worker polls for its raylet's death), long enough to finish a 64-row
    shard or a score block and return it. Near the end of featurisation, and of scoring's 24
    blocks, that left nothing to rerun and no worker replaced (CI, once in many runs: the
    scoring half on 2026-11-29, with node 2's raylet killed alone)."""
    c, local = cluster
    store = c.url(f"{fresh()}/lost-workers.zarr")
    job = c.submit([*FAULTS, f"store.path={store}"], tmp_path / "job.log")
    first = wait_for("a shard running on node 2 or 3", lambda: shard_node(c), job=job)
    c.kill(first, "all")
    other = 5 - first
    wait_for(f"a score block on node {other}", lambda: c.busy(other, "Scorer.run_block"), job=job)
    c.kill(other, "all")
    out = job.wait()  # the next test that needs them restarts nodes 2 and 3 (heal)
    assert job.proc.returncode == 0, out[-5000:]
    report = report_of(c, job)
    (variant,) = report["variants"]
    assert report["worker_restarts"] >= 1, report  # featurisation
    assert variant["scoring"]["worker_restarts"] >= 1, variant["scoring"]
    # A rerun shard recomputes only uncommitted chunks: no row is computed twice. A chunk the
    # lost worker committed before it died is counted as reused by the rerun (the lost worker's
    # own count never reaches the driver; CI, 2026-11-29: 64 train rows).
    done = {kind: report["rows_computed"][kind] + report["rows_reused"][kind] for kind in DIGITS}
    assert done == DIGITS, report
    assert report["rows_computed"]["train"] >= DIGITS["train"] - SHARD, report
    assert assert_same_bits(local.store("faults"), store) == {"checkpoints": 3, "variants": 1}
