"""A 3×3 proj_dim × λ sweep against a single run: the sweep must reuse the featurisation.

    python -m benchmarks.sweep

Both run `trak-dist` as a user would, on the embedded digits example, each in a fresh directory
(fresh store) with the checkpoint cache already warm, in this one invocation:
single = ``trak-dist proj_dim=2048 lambda_reg=0.01``;
sweep  = ``trak-dist -m proj_dim=512,1024,2048 lambda_reg=0.01,0.1,1`` (Hydra's basic launcher:
the 9 points run one after another in one process, which keeps Ray and the reducer alive).
"""

from __future__ import annotations

import csv
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks._table import table

CLI = [sys.executable, "-c", "from trak_dist.cli import main; main()"]
SINGLE = ["proj_dim=2048", "lambda_reg=0.01"]
SWEEP = ["-m", "proj_dim=512,1024,2048", "lambda_reg=0.01,0.1,1"]


def timed(args: list[str], cwd: Path, env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    out = subprocess.run(
        [*CLI, *args, "progress=false"], cwd=cwd, env=env, capture_output=True, text=True
    )
    if out.returncode:
        raise RuntimeError(f"trak-dist {' '.join(args)} failed:\n{out.stderr[-3000:]}")
    return time.perf_counter() - t0


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        env = {**os.environ, "TRAK_DIST_CACHE": str(root / "cache"), "RAY_USAGE_STATS_ENABLED": "0"}
        from trak_dist.examples import digits

        digits.checkpoints(cache_dir=str(root / "cache"))
        for name in ("single", "sweep"):
            (root / name).mkdir()
        single = timed([*SINGLE, "hydra.run.dir=out"], root / "single", env)
        sweep = timed([*SWEEP, "hydra.sweep.dir=out"], root / "sweep", env)
        with open(root / "sweep" / "out" / "sweep_summary.csv") as f:
            points = list(csv.DictReader(f))
    featurised = sum(int(p["featurised_rows"]) for p in points)
    print("\nSweep reuse, digits example (n=1500, 3 checkpoints)")
    print(
        table(
            ["run", "points", "wall s", "rows featurised", "× single"],
            [
                ["single proj_dim=2048 λ=0.01", 1, single, 3 * (1500 + 297), 1.0],
                ["sweep 3 proj_dim × 3 λ", len(points), sweep, featurised, sweep / single],
            ],
        )
    )


if __name__ == "__main__":
    main()
