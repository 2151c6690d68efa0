"""Peak memory of block-wise scoring as n grows (docs/design.md, invariant 5: independent of n
and m).

    python -m benchmarks.reducer_memory [--sizes 16384 65536 262144] [--proj-dim 256]

For each n, a store with one checkpoint of random float16 features (n × p) and m targets is
scored by ``compute_scores`` in a fresh process, train block 4096, target block 1024. "peak MiB"
is that process's peak RSS above its RSS just before scoring (imports and store opened). A dense
implementation would hold S (n × m float32) and X; the table shows both for comparison.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from benchmarks._table import table
from tests.fixtures.synthetic import synthetic_spec
from trak_dist.scoring import xtx_from_rows
from trak_dist.store import FeatureStore

CHILD = """
import json, sys, psutil
from trak_dist.scoring import ScoringConfig, compute_scores
from trak_dist.store import FeatureStore
store = FeatureStore.open(sys.argv[1])
before = psutil.Process().memory_info().rss
scoring = ScoringConfig("t", train_block=int(sys.argv[2]), target_block=int(sys.argv[3]))
compute_scores(store, scoring, [0], lambda_reg=1e-3)
# VmHWM, not ru_maxrss: Linux carries ru_maxrss across exec, so it would report the parent's
hwm = next(l for l in open("/proc/self/status") if l.startswith("VmHWM:"))
print(json.dumps({"before": before, "peak": int(hwm.split()[1]) * 1024}))
"""


def build(path: Path, n: int, m: int, p: int) -> None:
    spec = synthetic_spec(n, p, chunk_rows=4096)
    store = FeatureStore.create_or_open(path, spec)
    rng = np.random.default_rng(0)
    rows = store.ensure_checkpoint(0)
    for s in range(0, n, 16384):
        e = min(n, s + 16384)
        rows.write(
            s,
            rng.standard_normal((e - s, p), dtype=np.float32),
            rng.uniform(0.1, 1, e - s).astype(np.float32),
        )
    rows.commit(0, n)
    store.write_xtx(0, xtx_from_rows(rows, 0, n))
    store.ensure_experiment("t", m, None)
    targets = store.ensure_target_checkpoint("t", 0)
    targets.write(0, rng.standard_normal((m, p), dtype=np.float32))
    targets.commit(0, m)


def peak_mib(path: Path, train_block: int, target_block: int) -> float:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(path), str(train_block), str(target_block)],
        capture_output=True,
        text=True,
        check=True,
    )
    r = json.loads(out.stdout.strip().splitlines()[-1])
    return (r["peak"] - r["before"]) / 2**20


def run(
    sizes: list[int], m: int, p: int, train_block: int = 4096, target_block: int = 1024
) -> list[list[object]]:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in sizes:
            path = Path(tmp) / f"n{n}.zarr"
            build(path, n, m, p)
            dense = (n * m * 4 + n * p * 4) / 2**20
            rows.append([n, m, p, dense, peak_mib(path, train_block, target_block)])
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[16384, 65536, 262144])
    parser.add_argument("--targets", type=int, default=2048)
    parser.add_argument("--proj-dim", type=int, default=256)
    args = parser.parse_args()
    rows = run(args.sizes, args.targets, args.proj_dim)
    print("\nReducer peak memory, train block 4096, target block 1024")
    print(table(["n", "m", "p", "dense S + X MiB", "peak MiB"], rows))


if __name__ == "__main__":
    main()
