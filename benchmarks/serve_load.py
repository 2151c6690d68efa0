"""Load test of ``trak-dist serve`` on loopback: latency and throughput against numpy.

A synthetic store of n random float16 rows of width p per checkpoint (spec of the digits MLP, so
the service featurises real digits targets with real checkpoints) is served by Ray Serve; 1, 4
and 16 client threads each send one-target ``POST /attribute`` requests (k = 10) for a bounded
number of requests, ``--repeat`` times (the machine may be shared: each run is reported). The
baseline is a plain numpy brute-force top-k in this process over the same matrix (``S = X·Yᵀ``
in float32 blocks, ``argpartition``), for the same targets: its one-target latency, whether the
service's top-k indices equal it, and their recall@k (the fraction of numpy's top-k the
service returned: 1 for the exact index, measured for ``--ann``). Besides, in this process:
one target's featurisation, and one pass of the service's index (``--cpus`` threads) for 1 and
for 16 targets, so that the latency's parts are seen.

    python -m benchmarks.serve_load                       # n = 100k, p = 512, C = 1 and 3
    python -m benchmarks.serve_load --n 1000000 --checkpoints 1 --cpus 2
    python -m benchmarks.serve_load --n 1000000 --checkpoints 1 --ann IVF1024,Flat --nprobe 32

The index is held as the store's dtype (float16) unless ``--index-dtype`` says otherwise;
``--mmap`` memory-maps it.
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
import torch

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


def numpy_scores(x: np.ndarray | torch.Tensor, w: np.ndarray, y: np.ndarray) -> np.ndarray:
    """``[n, m]`` float32 ``(X·Yᵀ) ⊙ w`` by numpy, 65536 rows at a time (each block widened
    to float32 by torch: numpy's own float16 conversion costs more than the matmul)."""
    n, out = x.shape[0], []
    for r0 in range(0, n, 65536):
        xb = x[r0 : r0 + 65536]
        block = (torch.from_numpy(xb) if isinstance(xb, np.ndarray) else xb).float().numpy()
        out.append((block @ y.T) * w[r0 : r0 + 65536, None])
    return np.concatenate(out)


def numpy_topk(s: np.ndarray, k: int) -> list[list[int]]:
    """Per column of ``s`` ``[n, m]``, the indices of its k largest values, descending."""
    top = np.argpartition(-s, k, axis=0)[:k].T
    return [t[np.argsort(-s[t, j])].tolist() for j, t in enumerate(top)]


def _timed(f, repeats: int = 3) -> float:
    """Median seconds of ``f()`` over ``repeats`` calls after one warm-up."""
    f()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        f()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def baseline(cfg: JobConfig, ds, k: int) -> tuple[dict[int, list[int]], list[float]]:
    """numpy's top-k of targets 0-15 of ``ds`` over the exact index of ``cfg``'s store, and
    the seconds of: numpy's pass for one target, one target's featurisation, and the exact
    index's pass for 1 and for 16 targets (here, with ``serve.cpus_per_replica`` threads)."""
    from trak_dist.serve import AttributionIndex
    from trak_dist.serve._attributor import Attributor

    torch.set_num_threads(1)  # the index's pass threads, as in the replica
    exact = dataclasses.replace(cfg.serve, device="cpu", ann=None)
    att = Attributor(dataclasses.replace(cfg, serve=exact))
    assert isinstance(att.index, AttributionIndex)
    x, w = att.index.x, att.index.weight.numpy()
    picks = list(range(16))
    y16 = att.target_rows([ds[i] for i in picks])
    ref = dict(zip(picks, numpy_topk(numpy_scores(x, w, y16.numpy()), k), strict=True))
    return ref, [
        _timed(lambda: numpy_topk(numpy_scores(x, w, y16[:1].numpy()), k), 1),
        _timed(lambda: att.target_rows([ds[0]])),
        _timed(lambda: att.index.topk(y16[:1], k)),
        _timed(lambda: att.index.topk(y16, k), 1),
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--p", type=int, default=512)
    ap.add_argument("--checkpoints", default="1,3")
    ap.add_argument("--clients", default="1,4,16")
    ap.add_argument("--requests", type=int, default=16, help="requests per client")
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--mmap", action="store_true", help="memory-map the index (shared)")
    ap.add_argument("--index-dtype", default=ServeConfig.index_dtype)
    ap.add_argument("--batch-wait", type=float, default=ServeConfig.batch_wait_s)
    ap.add_argument("--cpus", type=float, default=1.0, help="serve.cpus_per_replica")
    ap.add_argument("--replicas", type=int, default=1, help="serve.num_replicas")
    ap.add_argument("--ann", default=None, help="serve.ann (a faiss index_factory string)")
    ap.add_argument("--nprobe", type=int, default=ServeConfig.ann_nprobe)
    ap.add_argument("--repeat", type=int, default=2, help="measured runs per client count")
    ap.add_argument(
        "--featurize-batch",
        type=int,
        default=ServeConfig.featurize_batch,
        help="targets per gradient call",
    )
    ap.add_argument("--dir", default=None, help="where the synthetic stores go (default: tmp)")
    args = ap.parse_args()

    import ray

    from trak_dist import serve

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
            cpus_per_replica=args.cpus,
            num_replicas=args.replicas,
            batch_wait_s=args.batch_wait,
            ann=args.ann,
            ann_nprobe=args.nprobe,
            featurize_batch=args.featurize_batch,
        )
        cfg = JobConfig(
            proj_dim=args.p,
            model=ModelConfig(checkpoints=ckpts),
            store=StoreConfig(path=str(path)),
            serve=sv,
            progress=False,
            report=None,
        )
        ref, times = baseline(cfg, ds, args.k)
        url = serve.start(cfg)
        for clients in [int(c) for c in args.clients.split(",")]:
            load(url, targets, clients, 2, args.k)  # warm-up
            for run in range(1, args.repeat + 1):
                p50, p99, tput, answers = load(url, targets, clients, args.requests, args.k)
                checked = [pos for pos in answers if pos in ref]
                same = sum(answers[pos] == ref[pos] for pos in checked)
                recall = statistics.mean(
                    len(set(answers[pos]) & set(ref[pos])) / args.k for pos in checked
                )
                rows.append(
                    [
                        args.n,
                        C,
                        (args.ann or f"exact {sv.index_dtype.replace('auto', 'float16')}")
                        + (
                            f", featurize_batch {sv.featurize_batch}"
                            if sv.featurize_batch > 1
                            else ""
                        ),
                        f"{args.replicas}x{args.cpus:g}",
                        clients,
                        run,
                        p50 * 1e3,
                        p99 * 1e3,
                        tput,
                        f"{same}/{len(checked)}",
                        recall,
                        *(t * 1e3 for t in times),
                    ]
                )
                print(table(HEADERS, rows[-1:]).splitlines()[-1], flush=True)
        serve.stop()
    print()
    print(table(HEADERS, rows))


HEADERS = [
    "n",
    "C",
    "index",
    "replicas x CPUs",
    "clients",
    "run",
    "p50 ms",
    "p99 ms",
    "targets/s",
    "top-k = numpy",
    "recall@k",
    "numpy 1 target ms",
    "featurise 1 ms",
    "pass 1 ms",
    "pass 16 ms",
]

if __name__ == "__main__":
    main()
