"""LDS of ``lambda_reg=auto`` against the best λ of a grid: MLP, CNN, transformer × (p < n, p ≥ n).

    python -m benchmarks.lds                 # the table of benchmarks/RESULTS.md
    python -m benchmarks.lds --models 40     # a quicker, noisier look

For each of the digits example's three networks (``trak_dist.examples.digits``: a 64-32-10 MLP,
a two-layer CNN, a one-block transformer over the image rows; n = 1500 train digits, m = 297
targets), in one invocation, through the product's own paths:

1. ``trak_dist.run`` featurises the checkpoints (3, trained on all 1500) at proj_dim 2048 on a
   local Ray and scores λ = auto; ``compute_scores`` then scores, from the same store,
   proj_dim 512 (< n, the prefix of the 2048 features) and 2048 (≥ n) for λ = auto, λ = 0
   (traker's default; singular at p ≥ n) and a grid of fixed λ: {1, 3}·10^k from 10⁻⁶ to 1
   times XᵀX's largest eigenvalue (averaged over checkpoints).
2. ``trak_dist.evaluate`` trains ``--models`` subset models (α = 0.5) per network with the
   example's recipe as Ray tasks and reports the LDS of every variant in the store.

The table gives, per network and proj_dim, the LDS at auto, at the grid's best λ, their ratio
(goal: ≥ 0.95 on every row) and at λ = 0. Everything is cached under ``--out`` (default
``.lds_bench``): a rerun reuses the stores and the subset models.
"""

from __future__ import annotations

import argparse
import functools
import logging
import time
from pathlib import Path

import numpy as np

from benchmarks._table import table
from trak_dist import evaluate, run
from trak_dist.config import ClusterConfig
from trak_dist.errors import IllConditionedError
from trak_dist.examples import digits
from trak_dist.lds import VariantLDS
from trak_dist.scoring import ScoringConfig, compute_scores, ensure_factor
from trak_dist.store import FeatureStore, variant_name

ARCHS = ("mlp", "cnn", "transformer")
P_SMALL, P_LARGE = 512, 2048
EXP = "targets"


def grid(top: float) -> list[float]:
    """{1, 3}·10^k from 1e-6 to 1 times ``top``, one significant digit."""
    lo, hi = np.floor(np.log10(top * 1e-6)), np.ceil(np.log10(top))
    values = [m * 10.0**k for k in np.arange(lo, hi + 1) for m in (1, 3)]
    return [float(f"{v:.1g}") for v in values if top * 1e-6 <= v <= top]


def featurize(arch: str, root: Path, checkpoints: int, workers: int) -> FeatureStore:
    path = root / f"{arch}.zarr"
    run(
        model=functools.partial(digits.make_model, arch=arch),
        checkpoints=digits.checkpoints(checkpoints, cache_dir=str(root / "cache"), arch=arch),
        train=digits.train_set,
        targets=digits.target_set,
        store=path,
        proj_dim=P_LARGE,
        lambda_reg="auto",
        num_workers=workers,
        progress=False,
        report=None,
    )
    return FeatureStore.open(path)


def score_variants(
    store: FeatureStore, checkpoints: int, dims: tuple[int, ...] = (P_SMALL, P_LARGE)
) -> dict[int, list[float | str]]:
    """Score every (p, λ) of the benchmark that the store lacks, p in ``dims``; the λs per p."""
    ids = list(range(checkpoints))
    out: dict[int, list[float | str]] = {}
    for p in dims:
        top = float(np.mean([ensure_factor(store, c, p).eigenvalues.max() for c in ids]))
        lams: list[float | str] = ["auto", 0.0, *grid(top)]
        out[p] = []
        for lam in lams:
            sset = store.score_set(EXP, variant_name(p, lam))
            if sset is None or not sset.complete:
                try:
                    compute_scores(store, ScoringConfig(EXP), ids, p, lam)
                except IllConditionedError:
                    continue  # λ = 0 at p ≥ n: singular, reported as such
            out[p].append(lam)
    return out


def rows_for(arch: str, d: int, res: dict[str, VariantLDS], lams: dict[int, list]) -> list[list]:
    rows = []
    for p in (P_SMALL, P_LARGE):
        auto = res[variant_name(p, "auto")]
        fixed = [res[variant_name(p, lam)] for lam in lams[p] if lam != "auto"]
        top = max(fixed, key=lambda r: r.result.lds)
        zero = res.get(variant_name(p, 0.0))
        rows.append(
            [
                arch,
                d,
                f"{p} ({'<' if p < 1500 else '≥'} n)",
                f"{auto.result.lds:.3f} [{auto.result.low:.3f}, {auto.result.high:.3f}]",
                f"{np.mean(auto.lambdas):.3g}",
                f"{top.lambda_reg:g}",
                f"{top.result.lds:.3f} [{top.result.low:.3f}, {top.result.high:.3f}]",
                f"{auto.result.lds / top.result.lds:.3f}",
                f"{zero.result.lds:.3f}" if zero else "singular",
            ]
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.lds", description=__doc__)
    parser.add_argument("--models", type=int, default=100, help="subset models per network")
    parser.add_argument("--checkpoints", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--archs", nargs="+", default=list(ARCHS), choices=ARCHS)
    parser.add_argument("--out", type=Path, default=Path(".lds_bench"))
    args = parser.parse_args()
    logging.getLogger("trak_dist").setLevel(logging.ERROR)  # λ = 0 warns of its conditioning
    root = args.out.resolve()
    rows, timings = [], []
    for arch in args.archs:
        t0 = time.perf_counter()
        store = featurize(arch, root, args.checkpoints, args.workers)
        lams = score_variants(store, args.checkpoints)
        t1 = time.perf_counter()
        ev = evaluate(
            recipe=digits.train_subset,
            model=digits.make_model,
            targets=digits.target_set,
            store=store.where,
            num_models=args.models,
            recipe_kwargs={"arch": arch},
            model_kwargs={"arch": arch},
            cluster=ClusterConfig(num_workers=args.workers),
            progress=False,
        )
        res = {r.variant: r for r in ev.variants}
        rows += rows_for(arch, store.spec.grad_dim, res, lams)
        timings.append((arch, t1 - t0, time.perf_counter() - t1, ev.run.trained))
        print(f"{arch}: featurise + score {t1 - t0:.0f} s, eval {time.perf_counter() - t1:.0f} s")
    print(
        f"\nLDS at λ=auto vs the best λ of a grid (n=1500 digits, m=297 targets, "
        f"{args.checkpoints} checkpoints, {args.models} subset models at α=0.5; "
        "95 % bootstrap intervals)"
    )
    print(
        table(
            [
                "model",
                "d",
                "proj_dim",
                "LDS auto",
                "auto λ (mean)",
                "best grid λ",
                "LDS best grid λ",
                "auto / best",
                "LDS λ=0",
            ],
            rows,
        )
    )


if __name__ == "__main__":
    main()
