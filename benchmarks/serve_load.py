"""Load test of ``trak-dist serve`` on loopback: latency and throughput against numpy.

A synthetic store of n random float16 rows of width p per checkpoint (spec of the digits MLP, so
the service featurises real digits targets with real checkpoints) is served by Ray Serve; 1, 4
and 16 client threads each send one-target ``POST /attribute`` requests (k = 10) for a bounded
number of requests. The baseline is a plain numpy brute-force top-k in this process over the
same matrix (``S = X·Yᵀ``, ``argpartition``), for the same targets: its latency, and whether
its top-k indices equal the service's.

    python -m benchmarks.serve_load                       # n = 100k, p = 512, C = 1 and 3
    python -m benchmarks.serve_load --n 1000000 --checkpoints 1 --mmap

The service and the baseline share the index through the page cache with ``--mmap`` (one copy
of X in memory), else each holds its own float32 copy.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import socket
import statistics
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from benchmarks._table import table
from trak_dist.config import JobConfig, ModelConfig, ServeConfig, StoreConfig
from trak_dist.examples import digits
from trak_dist.scoring import gram
from trak_dist.store import FeatureSpec, FeatureStore
from trak_dist.tasks import resolve_task
from trak_dist.tasks._base import describe

CHUNK = 8192
GRAM_ROWS = 32768  # XᵀX of synthetic rows: from a sample, scaled (any SPD K serves a load test)


def synthetic_store(path: Path, n: int, p: int, checkpoints: int, seed: int = 0) -> None:
    """n random rows per checkpoint, shaped as the digits MLP's features would be."""
    d = sum(t.numel() for t in digits.make_model().parameters())
    spec = FeatureSpec(
        proj_dim=p,
        projection="rademacher",
        seed=0,
        grad_wrt=None,
        model_output=describe(resolve_task("image_classification")),
        grad_dim=d,
        train_size=n,
        dataset_fingerprint=f"synthetic-{n}",
        dtype="float16",
        chunk_rows=CHUNK,
    )
    store = FeatureStore.create_or_open(path, spec, codec="none")
    rng = np.random.default_rng(seed)
    for c in range(checkpoints):
        rows = store.ensure_checkpoint(c)
        for r0 in range(0, n, CHUNK):
            r1 = min(n, r0 + CHUNK)
            x = rng.standard_normal((r1 - r0, p), dtype=np.float32)
            q = rng.uniform(0.05, 1.0, r1 - r0).astype(np.float32)
            rows.write(r0, x, q, np.arange(r0, r1, dtype=np.uint64) + 1)
            rows.commit(r0, r1)
        sample = rows.read(0, min(n, GRAM_ROWS))
        store.write_xtx(c, gram(sample) * (n / sample.shape[0]))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _post(url: str, target: list[object], k: int) -> tuple[float, list[int]]:
    body = json.dumps({"targets": [target], "k": k}).encode()
    req = urllib.request.Request(url + "attribute", data=body, method="POST")
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=300) as r:
        reply = json.loads(r.read())
    dt = time.perf_counter() - t0
    return dt, [int(i) for i, _ in reply["results"][0]["proponents"]]


def load(url: str, targets: list[list[object]], clients: int, requests: int, k: int):
    """Each of ``clients`` threads sends ``requests`` one-target requests, back to back."""
    jobs = [
        (targets[(c * requests + i) % len(targets)], c * requests + i)
        for c in range(clients)
        for i in range(requests)
    ]
    t0 = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        out = list(pool.map(lambda j: (j[1], *_post(url, j[0], k)), jobs))
    wall = time.perf_counter() - t0
    lat = [dt for _, dt, _ in out]
    p99 = float(np.percentile(lat, 99))
    answers = {pos % len(targets): idx for pos, _, idx in out}
    return statistics.median(lat), p99, len(out) / wall, answers


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--p", type=int, default=512)
    ap.add_argument("--checkpoints", default="1,3")
    ap.add_argument("--clients", default="1,4,16")
    ap.add_argument("--requests", type=int, default=16, help="requests per client")
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--mmap", action="store_true", help="memory-map the index (shared)")
    ap.add_argument("--index-dtype", default="float32")
    ap.add_argument("--batch-wait", type=float, default=ServeConfig.batch_wait_s)
    ap.add_argument("--dir", default=None, help="where the synthetic stores go (default: tmp)")
    args = ap.parse_args()

    import ray

    from trak_dist import serve
    from trak_dist.serve._attributor import Attributor

    ray.init(
        address="local",
        include_dashboard=False,
        logging_level="ERROR",
        object_store_memory=256 * 2**20,
    )
    ds = digits.target_set()
    targets = [[ds[i][0].tolist(), int(ds[i][1])] for i in range(len(ds))]
    rows = []
    root = Path(args.dir or tempfile.mkdtemp(prefix="serve_load_"))
    for C in [int(c) for c in args.checkpoints.split(",")]:
        path = root / f"n{args.n}_p{args.p}_c{C}.zarr"
        if not path.exists():
            t0 = time.perf_counter()
            synthetic_store(path, args.n, args.p, C)
            print(f"store {path}: {time.perf_counter() - t0:.0f} s", flush=True)
        ckpts = [str(c) for c in digits.checkpoints(num=C)]
        sv = ServeConfig(
            port=_free_port(),
            max_k=args.k,
            index_dtype=args.index_dtype,
            index_mmap_dir=str(root / "mmap") if args.mmap else None,
            cpus_per_replica=1.0,
            batch_wait_s=args.batch_wait,
        )
        cfg = JobConfig(
            proj_dim=args.p,
            model=ModelConfig(checkpoints=ckpts),
            store=StoreConfig(path=str(path)),
            serve=sv,
            progress=False,
            report=None,
        )
        # the baseline: plain numpy over the same X, Q and target rows
        att = Attributor(dataclasses.replace(cfg, serve=dataclasses.replace(sv, device="cpu")))
        x = att.index.x if isinstance(att.index.x, np.ndarray) else att.index.x.numpy()
        qw = att.index.qsum.numpy() / C / C
        ref, ref_lat, feat_lat = {}, [], []
        for i in range(16):
            t0 = time.perf_counter()
            y = att.target_rows([ds[i]]).numpy()[0]
            t1 = time.perf_counter()
            s = (x.astype(np.float32, copy=False) @ y) * qw
            top = np.argpartition(-s, args.k)[: args.k]
            ref[i] = top[np.argsort(-s[top])].tolist()
            feat_lat.append(t1 - t0)
            ref_lat.append(time.perf_counter() - t1)
        del att, x
        url = serve.start(cfg)
        for clients in [int(c) for c in args.clients.split(",")]:
            load(url, targets, clients, 2, args.k)  # warm-up
            p50, p99, tput, answers = load(url, targets, clients, args.requests, args.k)
            same = sum(answers[pos] == ref[pos] for pos in answers if pos in ref)
            checked = sum(pos in ref for pos in answers)
            rows.append(
                [
                    args.n,
                    args.p,
                    C,
                    clients,
                    p50 * 1e3,
                    p99 * 1e3,
                    tput,
                    statistics.median(ref_lat) * 1e3,
                    statistics.median(feat_lat) * 1e3,
                    f"{same}/{checked}",
                ]
            )
            print(table(HEADERS, rows[-1:]).splitlines()[-1], flush=True)
        serve.stop()
    print()
    print(table(HEADERS, rows))


HEADERS = [
    "n",
    "p",
    "C",
    "clients",
    "p50 ms",
    "p99 ms",
    "targets/s",
    "numpy top-k ms",
    "featurise ms",
    "top-k = numpy",
]

if __name__ == "__main__":
    main()
