"""One exact top-k pass of ``trak-dist serve``'s index, variants side by side in one process.

n random rows of width p (a float16 store's values), targets of 1 and 16 rows, k = 10, with 1
and 2 torch threads; the variants' passes are interleaved (round-robin, ``--repeat`` rounds,
median reported) so that a machine shared with other work slows them alike:

- ``previous``: the index before this change, re-created here: float32 X, 65536-row blocks,
  scores ``[rows, m]``, ``torch.topk`` along rows of ``S`` and of ``-S``.
- ``float32``, ``float16``: ``AttributionIndex`` holding X as that dtype (cache-sized float32
  blocks, ``[m, rows]`` scores, both selections along contiguous memory).
- ``numpy``: ``X·Yᵀ`` on the float32 X by numpy (OpenBLAS), ``argpartition`` for the top k.
- ``float16 pool``: the float16 index with ``threads`` pass threads (``serve.cpus_per_replica``
  whole CPUs), each torch call on one core; the other variants use ``threads`` torch (OpenMP)
  threads per call.

    python -m benchmarks.serve_index                      # n = 1M, p = 512
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np
import torch

from benchmarks._table import table
from trak_dist.scoring._topk import merge_block as _merge_topk
from trak_dist.serve import AttributionIndex


def previous_topk(x: torch.Tensor, w: torch.Tensor, y: torch.Tensor, k: int) -> None:
    best = worst = None
    for r0 in range(0, x.shape[0], 65536):
        block = (x[r0 : r0 + 65536] @ y.T) * w[r0 : r0 + 65536, None]
        best = _merge_topk(best, block, r0, k)
        worst = _merge_topk(worst, -block, r0, k)


def numpy_topk(x: np.ndarray, w: np.ndarray, y: np.ndarray, k: int) -> None:
    s = (x @ y.T) * w[:, None]
    np.argpartition(-s, k, axis=0)[:k]
    np.argpartition(s, k, axis=0)[:k]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--p", type=int, default=512)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()

    rng = np.random.default_rng(0)
    x16 = torch.from_numpy(rng.standard_normal((args.n, args.p), dtype=np.float32)).half()
    x32 = x16.float()
    q = torch.from_numpy(rng.uniform(0.05, 1.0, args.n).astype(np.float32))
    kinv = [torch.eye(args.p, dtype=torch.float64)]
    idx16 = AttributionIndex(x16, q, kinv, [1.0])
    idx32 = AttributionIndex(x32, q, kinv, [1.0])
    x32np, wnp = x32.numpy(), q.numpy()
    rows = []
    for threads in [int(t) for t in args.threads.split(",")]:
        pool = AttributionIndex(x16, q, kinv, [1.0], threads=threads)
        for m in (1, 16):
            y = torch.from_numpy(rng.standard_normal((m, args.p), dtype=np.float32))
            variants: dict[str, Callable[[], object]] = {
                "previous": lambda y=y: previous_topk(x32, q, y, args.k),
                "float32": lambda y=y: idx32.topk(y, args.k),
                "float16": lambda y=y: idx16.topk(y, args.k),
                "numpy": lambda y=y: numpy_topk(x32np, wnp, y.numpy(), args.k),
                "float16 pool": lambda y=y, pool=pool: pool.topk(y, args.k),
            }
            # per variant its torch threads: OpenMP ``threads`` per call, or 1 per pool thread
            intra = {name: 1 if name == "float16 pool" else threads for name in variants}
            times: dict[str, list[float]] = {name: [] for name in variants}
            for name, f in variants.items():
                torch.set_num_threads(intra[name])
                f()  # warm-up
            for _ in range(args.repeat):
                for name, f in variants.items():
                    torch.set_num_threads(intra[name])
                    t0 = time.perf_counter()
                    f()
                    times[name].append(time.perf_counter() - t0)
            med = {name: statistics.median(t) * 1e3 for name, t in times.items()}
            rows.append(
                [args.n, args.p, m, threads, *med.values(), med["previous"] / med["float16"]]
            )  # the columns follow ``variants``' order, as HEADERS does
            print(table(HEADERS, rows[-1:]).splitlines()[-1], flush=True)
    print()
    print(table(HEADERS, rows))


HEADERS = [
    "n",
    "p",
    "targets",
    "threads",
    "previous ms",
    "float32 ms",
    "float16 ms",
    "numpy ms",
    "float16 pool ms",
    "previous / float16",
]

if __name__ == "__main__":
    main()
