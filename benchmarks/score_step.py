"""The CPU score step beside a plain matmul of the same shapes, side by side in one run.

    python -m benchmarks.score_step [--n 262144] [--m 4096] [--p 512] [--checkpoints 1]
                                    [--rounds 3] [--write-scores topk] [--threads 0]

A store of n random float16 train rows (written through ``RowSet.write``, on /dev/shm), m
targets, one checkpoint's XᵀX; then per round, interleaved: **score blocks** (``Scorer``'s
blocks in this process: read X and Q from the store, the products, scaling, the finiteness
check, the exact top-k of both sides, the block's parts written) and **plain matmul** (the same
``[train_block, p] × [p, target_block]`` products on float32 rows already in memory, accumulated
over checkpoints as the blocks do, nothing else). The ratio is plain seconds ÷ block seconds
per round (median of ``--rounds``). ``prepare`` (Y, the plan) and ``finish`` (the merge,
publishing) are timed apart: they do not grow with n. ``--threads`` sets torch's threads (0:
torch's default, both cores here).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import numpy as np
import torch

from benchmarks._table import table
from tests.fixtures.synthetic import synthetic_spec
from trak_dist.scoring import Scorer, ScoreRequest, ScoringConfig, xtx_from_rows
from trak_dist.store import FeatureStore


def build(path: str, n: int, m: int, p: int, checkpoints: int) -> FeatureStore:
    store = FeatureStore.create_or_open(path, synthetic_spec(n, p, chunk_rows=min(n, 16384)))
    store.ensure_experiment("bench", m, None)
    rng = np.random.default_rng(0)
    for c in range(checkpoints):
        rows = store.ensure_checkpoint(c)
        chunk = rows.chunk_rows
        for s in range(0, n, chunk):
            e = min(n, s + chunk)
            x = rng.standard_normal((e - s, p), dtype=np.float32)
            q = rng.uniform(0.1, 1, e - s).astype(np.float32)
            rows.write(s, x, q, np.arange(s + 1, e + 1, dtype=np.uint64))
            rows.commit(s, e)
        store.write_xtx(c, xtx_from_rows(rows, 0, n, block=16384))
        targets = store.ensure_target_checkpoint("bench", c)
        targets.write(0, rng.standard_normal((m, p), dtype=np.float32))
        targets.commit(0, m)
    return store


def plain(store: FeatureStore, ids: list[int], ys: list[torch.Tensor], s: ScoringConfig) -> float:
    """Seconds of the blocks' products alone, on rows already in memory (float32)."""
    n = store.spec.train_size
    xs = [torch.from_numpy(store.train_rows(c).read(0, n).astype(np.float32)) for c in ids]
    m = ys[0].shape[0]
    t0 = time.perf_counter()
    for r0 in range(0, n, s.train_block):
        r1 = min(n, r0 + s.train_block)
        for c0 in range(0, m, s.target_block):
            c1 = min(m, c0 + s.target_block)
            acc = torch.zeros(r1 - r0, c1 - c0)
            for x, y in zip(xs, ys, strict=True):
                acc.addmm_(x[r0:r1], y[c0:c1].T)
    return time.perf_counter() - t0


def scored(store: FeatureStore, ids: list[int], s: ScoringConfig, lam: float) -> dict[str, float]:
    scorer = Scorer(store)
    request = ScoreRequest(s, tuple(ids), None, lam)  # a new λ: a new variant, every block run
    t0 = time.perf_counter()
    tasks = scorer.prepare_scores([request])
    t1 = time.perf_counter()
    results = scorer.run_blocks(tasks)
    t2 = time.perf_counter()
    scorer.finish_scores([request], results)
    t3 = time.perf_counter()
    return {"prepare": t1 - t0, "blocks": t2 - t1, "finish": t3 - t2}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=262144)
    ap.add_argument("--m", type=int, default=4096)
    ap.add_argument("--p", type=int, default=512)
    ap.add_argument("--checkpoints", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--write-scores", default="topk", choices=("topk", "full"))
    ap.add_argument("--threads", type=int, default=0)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    ids = list(range(args.checkpoints))
    with tempfile.TemporaryDirectory(dir="/dev/shm") as tmp:
        store = build(f"{tmp}/s.zarr", args.n, args.m, args.p, args.checkpoints)
        rng = torch.Generator().manual_seed(1)
        ys = [torch.randn(args.m, args.p, generator=rng) for _ in ids]
        rounds = []
        for r in range(args.rounds):
            s = ScoringConfig("bench", write_scores=args.write_scores)
            timed = scored(store, ids, s, 1.0 + r)
            timed["plain"] = plain(store, ids, ys, s)
            rounds.append(timed)
            print(f"round {r}: " + ", ".join(f"{k} {v:.2f} s" for k, v in timed.items()))
    flop = 2.0 * args.n * args.m * args.p * args.checkpoints
    med = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
    ratio = statistics.median(r["plain"] / r["blocks"] for r in rounds)
    print(
        f"\nn = {args.n}, m = {args.m}, p = {args.p}, C = {args.checkpoints}, "
        f"{args.write_scores}, torch threads {torch.get_num_threads()}; median of "
        f"{args.rounds} rounds\n"
    )
    headers = ["score blocks s", "plain matmul s", "blocks GFLOP/s", "matmul GFLOP/s",
               "blocks ÷ matmul", "prepare s", "finish s"]  # fmt: skip
    row = [med["blocks"], med["plain"], flop / med["blocks"] / 1e9, flop / med["plain"] / 1e9,
           ratio, med["prepare"], med["finish"]]  # fmt: skip
    print(table(headers, [row]))


if __name__ == "__main__":
    main()
