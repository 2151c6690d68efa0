"""Featurisation throughput with 1 and 2 Ray workers, and the default job end to end.

    python -m benchmarks.pipeline [--hidden 512] [--proj-dim 2048] [--skip-default]

Throughput runs a heavier variant of the digits MLP (hidden=512: d = 38,410 parameters,
p = 2048) so that featurisation, not actor start-up, dominates; the train set is digits repeated
``--reps`` times (default 8: 12000 rows) and 2 checkpoints; fp16 store, micro-batch 256
(``--micro-batch``), 1 CPU per worker. "featurize s" runs from the first worker being ready to
the last shard committed; worker start-up (imports, ~3 s) is reported apart. Both worker counts
run in this one invocation, on fresh stores, interleaved ``--rounds`` times (best kept), so their
ratio is measured side by side.

The default job is `trak-dist` with no arguments in a fresh directory, checkpoint cache
included (what a fresh clone's first run pays, after install).
"""

from __future__ import annotations

import argparse
import functools
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from torch.utils.data import TensorDataset

from benchmarks._table import table
from trak_dist.config import (
    ClusterConfig,
    DataConfig,
    FeaturizeConfig,
    JobConfig,
    ModelConfig,
    StoreConfig,
)
from trak_dist.distributed.driver import run_job
from trak_dist.examples import digits


def tiled_train(reps: int) -> TensorDataset:
    """The digits train set repeated ``reps`` times (throughput only: more rows per checkpoint,
    so per-checkpoint fixed costs weigh what they weigh at realistic n)."""
    x, y = digits.train_set().tensors
    return TensorDataset(x.repeat(reps, 1), y.repeat(reps))


def featurize_throughput(
    workers: int,
    hidden: int,
    proj_dim: int,
    ckpts: list[Path],
    root: Path,
    reps: int,
    micro_batch: int,
) -> dict[str, float]:
    cfg = JobConfig(
        proj_dim=proj_dim,
        lambda_reg=1e-2,
        model=ModelConfig(kwargs={"hidden": hidden}, checkpoints=[str(c) for c in ckpts]),
        data=DataConfig(train=functools.partial(tiled_train, reps)),
        featurize=FeaturizeConfig(micro_batch=micro_batch, shard_rows=256),
        store=StoreConfig(path=str(root / f"w{workers}.zarr"), chunk_rows=128),
        cluster=ClusterConfig(num_workers=workers),
        progress=False,
        report=None,
    )
    result = run_job(cfg)
    rows = sum(result.rows_computed.values())
    return {
        "rows": rows,
        "worker_start": result.phases["worker_start"],
        "featurize": result.phases["featurize"],
        "rate": rows / result.phases["featurize"],
        "total": result.phases["total"],
    }


def default_job(root: Path) -> tuple[float, int]:
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "TRAK_DIST_CACHE": str(root / "cache")}
    t0 = time.perf_counter()
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "from trak_dist.cli import main; main()",
            "progress=false",
            "hydra.run.dir=run",
        ],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
    )
    return time.perf_counter() - t0, out.returncode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--proj-dim", type=int, default=2048)
    parser.add_argument("--reps", type=int, default=8, help="train set = digits × reps")
    parser.add_argument("--micro-batch", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=2, help="interleaved repeats (best kept)")
    parser.add_argument("--skip-default", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        ckpts = digits.checkpoints(num=2, epochs=3, cache_dir=str(root / "ck"), hidden=args.hidden)
        # interleaved rounds, best of each: a shared machine's hiccups only ever slow a run
        runs: dict[int, dict[str, float]] = {}
        for r in range(args.rounds):
            for w in (1, 2):
                res = featurize_throughput(
                    w,
                    args.hidden,
                    args.proj_dim,
                    ckpts,
                    root / f"r{r}",
                    args.reps,
                    args.micro_batch,
                )
                if w not in runs or res["rate"] > runs[w]["rate"]:
                    runs[w] = res
        base = runs[1]["rate"]
        print(
            f"\nFeaturisation, digits MLP hidden={args.hidden}, proj_dim={args.proj_dim}, "
            f"train = digits × {args.reps}, 2 checkpoints, {os.cpu_count()} CPUs"
        )
        print(
            table(
                ["workers", "rows", "worker start s", "featurize s", "rows/s", "speedup"],
                [
                    [
                        w,
                        int(r["rows"]),
                        r["worker_start"],
                        r["featurize"],
                        r["rate"],
                        r["rate"] / base,
                    ]
                    for w, r in runs.items()
                ],
            )
        )
        if not args.skip_default:
            default_root = root / "default"
            default_root.mkdir()
            seconds, rc = default_job(default_root)
            print("\nDefault job (`trak-dist`, fresh directory, checkpoints trained on first use)")
            print(table(["wall s", "exit code"], [[seconds, rc]]))


if __name__ == "__main__":
    main()
