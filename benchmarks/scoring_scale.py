"""Scoring at scale, end to end: per stage seconds, bytes, peak RSS of every process, 1 vs 2
workers, and the scoring FLOP rate against a plain ``torch.mm`` of the same shapes.

    python -m benchmarks.scoring_scale --n 10000,100000,1000000 --m 1000,10000 [--p 512]
        [--checkpoints 1] [--workers 1,2] [--write-scores topk] [--memory 1GiB]

The model is a linear classifier (``--dim`` inputs, 10 classes: d = 10·dim + 10 parameters) on
synthetic Gaussian data, so featurising a million rows is minutes, not hours. For each n the
train set is featurised once (2 Ray workers) with the largest m's targets; every (m, workers)
then rescores that store (its scores dropped first), with ``--m`` < largest scoring the first
m targets of a separate experiment. Stages: featurise (first worker ready → last shard
committed), reduce + factorise (the reducer, after the last shard), score (prepare Y → blocks on
the workers → merge and publish). RSS: the maximum over the run of every process under this one
(the driver, Ray's workers, reducer and scorers, Ray's own daemons), sampled every 0.2 s.
matmul rate: one ``torch.mm`` of [train_block, p] × [p, target_block] float32 on one thread (a
worker's), repeated for ~1 s right after each run (the load of a shared machine drifts); the
scoring stage's rate is 2·n·m·p·C / score seconds (the whole stage: score actors' start, Y,
blocks, merge), as a fraction of (workers × that rate); "blocks ÷ mm": 2·n·m·p·C / the blocks'
compute seconds summed over the workers, against the same one-thread rate.
"""

from __future__ import annotations

import argparse
import functools
import shutil
import tempfile
import threading
import time
from pathlib import Path

import psutil
import torch
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks._table import table
from trak_dist.config import (
    ClusterConfig,
    DataConfig,
    FeaturizeConfig,
    JobConfig,
    ModelConfig,
    ScoringConfig,
    StoreConfig,
)
from trak_dist.distributed.driver import run_job

CLASSES = 10


def make_model(dim: int) -> nn.Module:
    return nn.Linear(dim, CLASSES)


def synthetic(n: int, dim: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    return TensorDataset(
        torch.randn(n, dim, generator=g), torch.randint(0, CLASSES, (n,), generator=g)
    )


class PeakRss:
    """Max RSS per process under this one (and this one), sampled in a thread."""

    def __init__(self, every_s: float = 0.2) -> None:
        self.every_s, self.peak, self.kind = every_s, {}, {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        me = psutil.Process()
        while not self._stop.is_set():
            for proc in [me, *me.children(recursive=True)]:
                try:
                    rss = proc.memory_info().rss
                    title = " ".join(proc.cmdline())[:80]
                except psutil.Error:
                    continue
                if rss > self.peak.get(proc.pid, 0):
                    self.peak[proc.pid] = rss
                for key in ("Scorer", "Reducer", "Worker", "raylet", "gcs_server"):
                    if key in title:
                        self.kind[proc.pid] = key
                        break
                else:
                    self.kind.setdefault(proc.pid, "driver" if proc.pid == me.pid else "other")
            self._stop.wait(self.every_s)

    def by_kind(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for pid, rss in self.peak.items():
            k = self.kind.get(pid, "other")
            out[k] = max(out.get(k, 0.0), rss / 2**30)
        return out


def mm_rate(rows: int, p: int, cols: int) -> float:
    """FLOP/s of one thread's ``torch.mm`` [rows, p] × [p, cols] float32."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        a, b = torch.randn(rows, p), torch.randn(p, cols)
        torch.mm(a, b)
        reps, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < 1.0:
            torch.mm(a, b)
            reps += 1
        return 2.0 * rows * p * cols * reps / (time.perf_counter() - t0)
    finally:
        torch.set_num_threads(threads)


def du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.exists() else 0


def job(root: Path, n: int, m: int, args: argparse.Namespace, workers: int, ckpts: list[str]):
    exp = f"m{m}"
    return JobConfig(
        proj_dim=args.p,
        lambda_reg="auto",
        model=ModelConfig(factory=functools.partial(make_model, args.dim), checkpoints=ckpts),
        data=DataConfig(
            train=functools.partial(synthetic, n, args.dim, 0),
            targets=functools.partial(synthetic, m, args.dim, 1),
            train_fingerprint=f"synthetic-{n}-{args.dim}",
        ),
        featurize=FeaturizeConfig(micro_batch=1024, shard_rows=args.shard_rows),
        store=StoreConfig(path=str(root / f"n{n}.zarr"), chunk_rows=args.chunk_rows),
        scoring=ScoringConfig(
            exp_name=exp, write_scores=args.write_scores, memory=args.memory, topk=10
        ),
        cluster=ClusterConfig(num_workers=workers),
        progress=False,
        report=None,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ints = lambda s: [int(float(x)) for x in s.split(",")]  # noqa: E731
    parser.add_argument("--n", type=ints, default=[10000, 100000])
    parser.add_argument("--m", type=ints, default=[1000])
    parser.add_argument("--p", type=int, default=512)
    parser.add_argument("--dim", type=int, default=64, help="model inputs (d = 10·dim + 10)")
    parser.add_argument("--checkpoints", type=int, default=1)
    parser.add_argument("--workers", type=ints, default=[1, 2])
    parser.add_argument("--write-scores", default="topk")
    parser.add_argument("--memory", default="1GiB")
    parser.add_argument("--chunk-rows", type=int, default=4096)
    parser.add_argument("--shard-rows", type=int, default=32768)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        ckpts = []
        for c in range(args.checkpoints):
            torch.manual_seed(c)
            path = root / f"ckpt{c}.pt"
            torch.save(make_model(args.dim).state_dict(), path)
            ckpts.append(str(path))
        for n in args.n:
            for m in args.m:
                # the most workers first: that run featurises (train once per n, targets per m)
                for w in sorted(args.workers, reverse=True):
                    cfg = job(root, n, m, args, w, ckpts)
                    shutil.rmtree(Path(cfg.store.path) / "scores", ignore_errors=True)
                    before = du(Path(cfg.store.path))
                    with PeakRss() as rss:
                        result = run_job(cfg)
                    sc, ph = result.scores[0], result.phases
                    # timed right after the stage: a shared machine's load drifts within a run
                    rate1 = mm_rate(4096, args.p, 1024)
                    flops = 2.0 * n * m * args.p * args.checkpoints
                    rate = flops / max(ph["score"], 1e-9)
                    # per worker, while computing blocks (no actor start, Y or merge)
                    block_rate = flops / max(sc.block_seconds, 1e-9)
                    rows.append(
                        [
                            n,
                            m,
                            w,
                            round(ph.get("featurize", 0.0), 1),
                            round(ph.get("reduce", 0.0), 1),
                            round(ph["score"], 1),
                            sc.write_scores,
                            sc.x_passes,
                            f"{sc.bytes_read / 2**20:.0f}",
                            f"{(du(Path(cfg.store.path)) - before) / 2**20:.0f}",
                            f"{rate / 1e9:.1f}",
                            f"{rate / (w * rate1):.2f}",
                            f"{block_rate / rate1:.2f}",
                            f"{rate1 / 1e9:.1f}",
                            " ".join(f"{k}={v:.2f}" for k, v in sorted(rss.by_kind().items())),
                        ]
                    )
                    print(table(HEADERS, rows[-1:]), flush=True)
            shutil.rmtree(root / f"n{n}.zarr", ignore_errors=True)
    print(
        f"\nScoring at scale: p={args.p}, C={args.checkpoints}, linear model d="
        f"{CLASSES * args.dim + CLASSES}, write_scores={args.write_scores}, memory={args.memory}; "
        f"mm: plain torch.mm [4096, {args.p}]×[{args.p}, 1024], 1 thread, after each run"
    )
    print(table(HEADERS, rows))


HEADERS = [
    "n",
    "m",
    "workers",
    "featurize s",
    "reduce+factorise s",
    "score s",
    "written",
    "X passes",
    "score MiB read",
    "store MiB written",
    "score GFLOP/s",
    "÷ (workers × mm)",
    "blocks ÷ mm",
    "mm GFLOP/s",
    "peak RSS GiB per process kind",
]

if __name__ == "__main__":
    main()
