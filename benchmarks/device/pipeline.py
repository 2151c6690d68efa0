"""Section ``pipeline``: the whole in-process pipeline (``run_pipeline`` with the
``InProcessExecutor``: no Ray) on the GPU (featurise and score on cuda: the CUDA kernel for the
dense job, the Kronecker projector's factors on the GPU for the other), against the same job on
the CPU. The digits MLP (hidden 64), two checkpoints, p = 256 (the dry run: the first 512 train
rows and 64 targets).

Compared: every stored train row X (error relative to the row's L2 norm ≤ 2⁻¹⁰: per-sample
gradients summed in another order, the kernel's fp32 split), the scores (relative to the
largest |S| ≤ 2⁻¹⁰), and the top-10 proponents (share of targets whose list is the same). In
the dry run the "GPU" job runs on the CPU with the shards in reverse order: the stored rows and
scores must then be the same bits (docs/design.md's invariant)."""

from __future__ import annotations

import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np
from torch.utils.data import Dataset, Subset

from benchmarks.device._section import Section
from trak_dist.config import (
    ClusterConfig,
    DataConfig,
    FeaturizeConfig,
    JobConfig,
    ModelConfig,
    ProjectionConfig,
    ScoringConfig,
    StoreConfig,
)
from trak_dist.examples import digits
from trak_dist.pipeline import InProcessExecutor, run_pipeline
from trak_dist.store import FeatureStore, variant_name

P, LAMBDA, HIDDEN, TOL = 256, 1e-2, 64, 2.0**-10


def first(make: Callable[[], Dataset], n: int) -> Dataset:
    """The first ``n`` items of ``make()``."""
    return Subset(make(), range(n))


def job(store: Path, checkpoints: list[str], device: str, kind: str, small: bool) -> JobConfig:
    """The digits job; ``small``: 512 train rows and 64 targets in shards of 256 rows."""
    data = DataConfig()
    if small:
        data = DataConfig(
            train=partial(first, digits.train_set, 512),
            targets=partial(first, digits.target_set, 64),
        )
    chunk = 128 if small else 256
    return JobConfig(
        proj_dim=P,
        lambda_reg=LAMBDA,
        model=ModelConfig(kwargs={"hidden": HIDDEN}, checkpoints=checkpoints),
        data=data,
        projection=ProjectionConfig(kind=kind),
        featurize=FeaturizeConfig(
            micro_batch=64, shard_rows=2 * chunk, half_precision=False, device=device
        ),
        store=StoreConfig(path=str(store), chunk_rows=chunk),
        scoring=ScoringConfig(device=device),
        cluster=ClusterConfig(num_workers=1),
        progress=False,
        report=None,
    )


def stored(cfg: JobConfig) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """X ``[C, n, p]``, S ``[n, m]`` and the proponents ``[m, k]`` of a finished job."""
    store = FeatureStore.open(cfg.store.path, mode="r")
    xs = [store.train_rows(m).read(0, store.spec.train_size) for m in store.checkpoint_ids()]
    sset = store.score_set(cfg.scoring.exp_name, variant_name(P, LAMBDA))
    if sset is None:
        raise RuntimeError(f"no scores in {cfg.store.path}")
    return np.stack(xs), sset.scores(), sset.read_topk()["proponents_idx"]


def compare(s: Section, kind: str, root: Path, checkpoints: list[str]) -> None:
    times = {}
    results = {}
    for label, device, reverse in (("device", s.device, not s.gpu), ("cpu", "cpu", False)):
        cfg = job(root / f"{kind}-{label}.zarr", checkpoints, device, kind, not s.gpu)
        t0 = time.perf_counter()
        out = run_pipeline(cfg, InProcessExecutor(reverse=reverse))
        times[label] = (time.perf_counter() - t0, out.phases.get("featurize", float("nan")))
        results[label] = stored(cfg)
    (x, sc, top), (x0, s0, top0) = results["device"], results["cpu"]
    x_err = float((np.abs(x - x0).max(axis=2) / np.linalg.norm(x0, axis=2)).max())
    s_err = float(np.abs(sc - s0).max() / np.abs(s0).max())
    same_top = float((top == top0).all(axis=1).mean())
    exact = bool(np.array_equal(x, x0) and np.array_equal(sc, s0))
    s.row(
        [
            kind,
            f"{times['device'][0]:.1f} ({times['device'][1]:.1f})",
            f"{times['cpu'][0]:.1f} ({times['cpu'][1]:.1f})",
            f"{x_err:.2g}",
            f"{s_err:.2g}",
            f"{same_top:.0%}",
            "yes" if exact else "no",
        ]
    )
    s.record(f"{kind}_x_err", x_err)
    s.record(f"{kind}_s_err", s_err)
    s.record(f"{kind}_same_top10", same_top)
    if x_err > TOL or s_err > TOL:
        s.fail(f"{kind}: the {s.device} job's X or S is off the CPU job's by more than {TOL:.2g}")
    if not s.gpu and not exact:
        s.fail(f"{kind}: the reversed-shard job's rows or scores are not the same bits")
    if same_top < 0.9:
        s.fail(f"{kind}: only {same_top:.0%} of the targets keep their top-10 proponents")


def main() -> int:
    s = Section()
    with tempfile.TemporaryDirectory(prefix="trak_device_pipeline_") as tmp:
        root = Path(tmp)
        ckpts = [
            str(c)
            for c in digits.checkpoints(
                num=2, epochs=5, hidden=HIDDEN, cache_dir=str(root / "cache")
            )
        ]
        device = "cuda (the kernel; scoring on cuda)" if s.gpu else "cpu, shards reversed"
        s.write(
            f"digits MLP (hidden {HIDDEN}), 2 checkpoints, p = {P}, λ = {LAMBDA}; "
            f"in-process executor; job on {device} vs the same job on the CPU"
        )
        s.table(
            [
                "projection",
                f"{'cuda' if s.gpu else 'cpu, reversed'} job s (featurise s)",
                "cpu job s (featurise s)",
                "X error / ‖x‖₂",
                "S error / max S",
                "same top-10",
                "same bits",
            ],
            [],
        )
        for kind in ("rademacher", "kronecker"):
            if s.out_of_time(f"the {kind} jobs", 5):
                break
            compare(s, kind, root, ckpts)
    return s.done()


if __name__ == "__main__":
    sys.exit(main())
