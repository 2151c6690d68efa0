"""The same job on 1 and on 3 Ray nodes, the store on a disk every node mounts vs on S3
(SeaweedFS): per-stage seconds, bytes in the store, bytes scoring read and wrote.

    python -m benchmarks.multinode [--args proj_dim=2048 ...] [--repeats 1]     (root)

Brings up the cluster of ``.ci/multinode/`` (three Ray nodes, one CPU each, and SeaweedFS,
each in its own network namespace of this machine; the nodes share no /tmp), submits the job
with ``ray job submit`` from outside it, reads the report the job writes, and tears the cluster
down. "disk" is a folder under /var/tmp, which every node sees at the same path (as an NFS
mount would be, but local: the best case of a shared file system). 1 node: nodes 2 and 3 are
stopped. All nodes share this machine's cores, so 3 nodes cannot be faster than its cores
allow: the ratios say what the cluster and the object store cost, not what more machines buy.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from benchmarks._table import table
from tests.fixtures.multinode import Cluster, missing

PHASES = ("setup", "worker_start", "featurize", "reduce", "score", "total")
DISK = Path("/var/tmp/trak-dist-bench-multinode")


def store_bytes(cluster: Cluster, store: str) -> int:
    if store.startswith("s3://"):
        key = store.split("://", 1)[1].partition("/")[2]
        import obstore

        batches = obstore.list(cluster.bucket(), prefix=f"{key}/")
        return sum(o["size"] for batch in batches for o in batch)
    return sum(p.stat().st_size for p in Path(store).rglob("*") if p.is_file())


def run(cluster: Cluster, args: list[str], store: str, log: Path) -> dict:
    t0 = time.monotonic()
    extra = [] if store.startswith("s3://") else [f"hydra.run.dir={store}.out"]
    job = cluster.submit([*args, f"store.path={store}", "progress=false", *extra], log)
    out = job.wait(timeout=1800)
    wall = time.monotonic() - t0
    if job.proc.returncode != 0:
        raise SystemExit(f"job failed:\n{out[-3000:]}")
    if store.startswith("s3://"):
        report = cluster.read_json(job.report_url().removesuffix(".md") + ".json")
    else:  # the report of a disk store is in hydra.run.dir, on the shared disk too
        report = json.loads(Path(f"{store}.out/trak_report.json").read_text())
    (sc,) = [v["scoring"] for v in report["variants"]]
    return {
        "wall": wall,
        **{p: report["phases_s"][p] for p in PHASES},
        "store_mb": store_bytes(cluster, store) / 2**20,
        "score_read_mb": sc["bytes_read"] / 2**20,
        "score_written_mb": sc["bytes_written"] / 2**20,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--args", nargs="*", default=[], help="job overrides (default: the default job)"
    )
    ap.add_argument("--repeats", type=int, default=1)
    a = ap.parse_args()
    reason = missing()
    if reason:
        raise SystemExit(f"benchmarks.multinode: {reason}")
    work = Path(tempfile.mkdtemp(prefix="trak-bench-multinode-"))
    if DISK.exists():
        shutil.rmtree(DISK)
    DISK.mkdir(parents=True)
    rows = []
    t0 = time.monotonic()
    cluster = Cluster.up(work / "cluster")
    up_s = time.monotonic() - t0
    try:
        for rep in range(a.repeats):
            for nodes in (3, 1):
                if nodes == 1:  # the head alone
                    for k in (2, 3):
                        cluster.node("stop", str(k))
                elif rep:
                    cluster.restart(2, 3)
                for where in ("disk", "s3"):
                    name = f"r{rep}-{nodes}n-{where}.zarr"
                    store = str(DISK / name) if where == "disk" else cluster.url(f"bench/{name}")
                    r = run(cluster, a.args, store, work / f"{name}.log")
                    row = [nodes, where, *(round(r[k], 1) for k in ("wall", *PHASES))]
                    row += [
                        round(r[k], 2) for k in ("store_mb", "score_read_mb", "score_written_mb")
                    ]
                    rows.append(row)
                    print(f"  {nodes} node(s), {where}: {r['total']:.1f} s", flush=True)
    finally:
        cluster.down()
        shutil.rmtree(DISK, ignore_errors=True)
    load = os.getloadavg()
    print(
        f"\njob: trak-dist cluster=ray {' '.join(a.args) or '(the default job)'}; cluster up in "
        f"{up_s:.0f} s; load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}; "
        f"{os.cpu_count()} cores for all nodes\n"
    )
    headers = [
        "nodes",
        "store",
        "submit→end s",
        *(f"{p} s" for p in PHASES),
        "store MiB",
        "scoring read MiB",
        "scoring wrote MiB",
    ]
    print(table(headers, rows))


if __name__ == "__main__":
    main()
