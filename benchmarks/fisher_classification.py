"""The sampled-label Fisher (``featurize.curvature=fisher``) on the digits classifiers, against
XᵀX (issue 29: the curvature is the default for a task only where it does not lose).

    python -m benchmarks.fisher_classification --only mlp,cnn     # after benchmarks.lds_rules

The pipeline featurises the digits networks' 5 checkpoints of ``benchmarks.lds_rules`` at
p = 2048 twice (XᵀX, Fisher; one thread, in-process) and ``lds_rules.curves`` reads LDS curves
over λ / mean eigenvalue from each store against ``lds_rules``' cached 200 subset models: the
table gives the LDS at λ auto and at each curve's best, per p and checkpoint count.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import numpy as np
import torch

from benchmarks import lds_rules as lr
from benchmarks._table import table
from trak_dist.config import (
    ClusterConfig,
    FeaturizeConfig,
    JobConfig,
    ModelConfig,
    StoreConfig,
)
from trak_dist.examples import digits
from trak_dist.pipeline import InProcessExecutor, run_pipeline
from trak_dist.scoring import AUTO_SCALE
from trak_dist.store import FeatureStore


def store_for(arch: str, root: Path, curvature: str) -> FeatureStore:
    path = root / f"{arch}_{curvature}.zarr"
    if not (path / "train" / "4" / "xtx" / "zarr.json").exists():
        shutil.rmtree(path, ignore_errors=True)
        ckpts = digits.checkpoints(num=lr.C, arch=arch, cache_dir=str(root / "cache"))
        cfg = JobConfig(
            proj_dim=max(lr.PS),
            model=ModelConfig(
                factory="trak_dist.examples.digits:make_model",
                kwargs={"arch": arch},
                checkpoints=[str(c) for c in ckpts],
            ),
            featurize=FeaturizeConfig(curvature=curvature, device="cpu"),
            store=StoreConfig(path=str(path)),
            cluster=ClusterConfig(num_workers=1),
            progress=False,
            report=None,
        )
        run_pipeline(cfg, InProcessExecutor())
    return FeatureStore.open(path)


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.fisher_classification")
    ap.add_argument("--only", default="mlp,cnn")
    ap.add_argument("--out", type=Path, default=Path(".lds_bench/rules"))
    a = ap.parse_args()
    torch.set_num_threads(1)
    rows = []
    for arch in a.only.split(","):
        masks, margins = lr.truth(arch, a.out)
        for curvature in ("xtx", "fisher"):
            store = store_for(arch, a.out, curvature)
            for (p, k), (lds, _) in lr.curves(store, masks, margins).items():
                auto = AUTO_SCALE * p / min(lr.N, p)  # λ auto in units of the mean eigenvalue
                at = float(np.interp(np.log(auto), np.log(lr.GRID), lds))
                best = int(np.argmax(lds))
                rows.append(
                    [arch, curvature, p, k, f"{at:.3f}", f"{lds[best]:.3f} ({lr.GRID[best]:.3g})"]
                )
        print(table(["net", "curvature", "p", "ckpts", "LDS λ auto", "best (λ/mean)"], rows))


if __name__ == "__main__":
    main()
