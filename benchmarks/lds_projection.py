"""LDS of the Kronecker projection against dense Rademacher, on the same subset models (issue 9).

    python -m benchmarks.lds_projection                      # the table of benchmarks/RESULTS.md
    python -m benchmarks.lds_projection --nets mlp128 --models 30     # a quicker, noisier look

Per network (``NETS``: by default the digits MLP 64-128-10 and a 2-layer BERT of hidden size 64
on the generated keyword sequences of ``trak_dist.examples.tiny_bert``, both through the hook
engine), in one invocation, through the product's own paths on one local Ray:

1. ``trak_dist.run`` featurises ``--checkpoints`` checkpoints twice: dense Rademacher at the
   large p, and Kronecker at twice that (its prefix property makes the first p' columns the
   p'-dimensional Kronecker projection, so one store serves p and 2p).
2. ``trak_dist.evaluate`` trains ``--models`` subset models (α = 0.5) on the dense store. They
   depend on the train set and the recipe, not on the projection, so the Kronecker store's
   scores are measured against the *same* models: the comparison is side by side.
3. ``compute_scores`` scores both stores at the small p (< n) and the large p (≥ n), each at
   λ = auto and the grid of ``benchmarks.lds``, and the Kronecker store at 2p at λ = auto
   (``--grid-2p``: the grid too; at 2p = 4096 that is ~10 more minutes of XᵀX inverses here).
4. Featurisation time: the train set through one checkpoint in this process (hook engine, one
   torch thread), each projector warmed up once, then ``--rounds`` rounds interleaved; median.

Per (network, p, projection): the LDS at λ = auto and at the grid's best λ (95 % bootstrap
intervals over models and targets), and the Kronecker − dense difference, paired: both on the
same resamples, so the noise of the shared subset models largely cancels. Everything is cached
under ``--out``: a rerun reuses the checkpoints, stores, scores and subset models.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import logging
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks import lds as dense_bench
from benchmarks._table import table
from trak_dist import evaluate, run
from trak_dist.config import ClusterConfig, EvalConfig, ProjectionConfig
from trak_dist.distributed._ray import connect
from trak_dist.examples import digits, tiny_bert
from trak_dist.featurize import build_featurizer
from trak_dist.gradients import make_computer, resolve_engine
from trak_dist.lds import LDSResult, lds, score_predictions, spearman
from trak_dist.lds._metric import _weighted_spearman  # the estimator behind lds()'s interval
from trak_dist.scoring import ScoringConfig, compute_scores
from trak_dist.store import FeatureStore, variant_name
from trak_dist.tasks import resolve_task

EXP = dense_bench.EXP
BOOTSTRAP, SEED = 1000, 0  # EvalConfig's defaults: the dense rows are `trak-dist eval`'s


@dataclass(frozen=True)
class Net:
    """One network of the benchmark: an example's factory, data, recipe and the two p."""

    label: str
    example: Any  # the module: make_model, checkpoints, train_set, target_set, train_subset
    kwargs: dict[str, Any]  # make_model's, train_subset's and checkpoints' keyword arguments
    task: str
    dims: tuple[int, int]  # (p < n, p ≥ n)


NETS = {
    # the first layer [128, 64] is seen in its natural Kronecker view (both sides ≥ 64)
    "mlp128": Net("digits MLP 64-128-10", digits, {"hidden": 128}, "image_classification",
                  (512, 2048)),
    # hidden 64: every attention and FFN matrix in its natural view; n = 256 train, m = 64
    "bert": Net("BERT 2×64 (keywords)", tiny_bert, {"hidden": 64}, "text_classification",
                (128, 512)),
    "mlp": Net("digits MLP 64-32-10", digits, {}, "image_classification", (512, 2048)),
    "cnn": Net("digits CNN", digits, {"arch": "cnn"}, "image_classification", (512, 2048)),
}  # fmt: skip


def featurize(net: str, root: Path, proj_dim: int, kind: str, args: argparse.Namespace) -> Path:
    spec = NETS[net]
    path = root / f"{net}-{kind}.zarr"
    run(
        model=functools.partial(spec.example.make_model, **spec.kwargs),
        checkpoints=spec.example.checkpoints(
            args.checkpoints, cache_dir=str(root / "cache"), **spec.kwargs
        ),
        train=spec.example.train_set,
        targets=spec.example.target_set,
        task=spec.task,
        store=path,
        proj_dim=proj_dim,
        lambda_reg="auto",
        num_workers=args.workers,
        projection=ProjectionConfig(kind=kind),
        progress=False,
        report=None,
    )
    return path


def featurize_ms(net: str, root: Path, variants: dict[str, tuple[str, int]], rounds: int) -> dict:
    """Median ms to featurise the train set through checkpoint 0, per variant ``(kind, p)``."""
    spec = NETS[net]
    model = spec.example.make_model(**spec.kwargs)
    (ckpt,) = spec.example.checkpoints(1, cache_dir=str(root / "cache"), **spec.kwargs)
    model.load_state_dict(torch.load(ckpt, weights_only=True))
    model.eval()
    task = resolve_task(spec.task)
    batch = tuple(spec.example.train_set().tensors)
    computer = make_computer(model, task, engine="hooks")
    feats = {
        k: build_featurizer(computer, kind, p, micro_batch=64) for k, (kind, p) in variants.items()
    }
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # steadier on a shared CPU; every variant alike
    try:
        for f in feats.values():
            f.project(batch, 0)  # warm-up: the dense projector's packed P, the Kronecker factors
        times: dict[str, list[float]] = {k: [] for k in feats}
        for _ in range(rounds):
            for k, f in feats.items():
                t0 = time.perf_counter()
                f.project(batch, 0)
                times[k].append(1e3 * (time.perf_counter() - t0))
    finally:
        torch.set_num_threads(threads)
    return {k: statistics.median(v) for k, v in times.items()}


def point(pred: np.ndarray, actual: np.ndarray) -> float:
    return float(np.nanmean(spearman(pred, actual)))


def paired_difference(
    base: np.ndarray, other: np.ndarray, actual: np.ndarray, level: float = 0.95
) -> tuple[float, float, float]:
    """LDS(other) − LDS(base) and its percentile interval, both predictions ``[M, m]`` scored on
    the same bootstrap resamples of models and targets (drawn as ``lds`` draws them)."""
    ra, rb = spearman(base, actual), spearman(other, actual)
    ok = ~np.isnan(ra) & ~np.isnan(rb)
    delta = float(rb[ok].mean() - ra[ok].mean())
    n_models, n_targets = actual.shape[0], int(ok.sum())
    orders = [np.argsort(x[:, ok], axis=0) for x in (base, other, actual)]
    rng = np.random.default_rng(SEED)
    draws = np.empty(BOOTSTRAP)
    for b in range(BOOTSTRAP):
        wm = np.bincount(rng.integers(0, n_models, n_models), minlength=n_models).astype(float)
        wt = np.bincount(rng.integers(0, n_targets, n_targets), minlength=n_targets)
        r0 = _weighted_spearman(orders[0], orders[2], wm)
        r1 = _weighted_spearman(orders[1], orders[2], wm)
        keep = ~np.isnan(r0) & ~np.isnan(r1) & (wt > 0)
        draws[b] = (wt[keep] * (r1 - r0)[keep]).sum() / wt[keep].sum()
    low, high = np.nanquantile(draws, [(1 - level) / 2, (1 + level) / 2])
    return delta, float(low), float(high)


@dataclass
class Picks:
    """At one p: λ = auto's and the grid's best λ's predictions ``[M, m]`` and LDS (None where
    only auto was scored)."""

    auto: np.ndarray
    auto_lds: LDSResult
    best: np.ndarray | None = None
    best_lam: float | None = None
    best_lds: LDSResult | None = None


def picks(store: FeatureStore, p: int, lams: list, masks: np.ndarray, actual: np.ndarray) -> Picks:
    """The grid's best λ by the point LDS; intervals for auto and that λ only (the bootstrap of
    every grid λ would cost minutes and decide nothing)."""
    preds = {}
    for lam in lams:
        sset = store.score_set(EXP, variant_name(p, lam))
        assert sset is not None and sset.complete  # score_variants wrote it
        preds[lam] = score_predictions(sset, masks)
    auto = Picks(preds["auto"], lds(preds["auto"], actual, BOOTSTRAP, seed=SEED))
    fixed = [lam for lam in lams if lam != "auto"]
    if not fixed:
        return auto
    top = max(fixed, key=lambda lam: point(preds[lam], actual))
    best = lds(preds[top], actual, BOOTSTRAP, seed=SEED)
    return dataclasses.replace(auto, best=preds[top], best_lam=float(top), best_lds=best)


def interval(r: LDSResult) -> str:
    return f"{r.lds:.3f} [{r.low:.3f}, {r.high:.3f}]"


def diff(base: Picks, other: Picks, actual: np.ndarray, which: str) -> str:
    if getattr(other, which) is None:
        return "-"
    d, lo, hi = paired_difference(getattr(base, which), getattr(other, which), actual)
    return f"{d:+.3f} [{lo:+.3f}, {hi:+.3f}]"


def bench(net: str, root: Path, args: argparse.Namespace) -> list[list]:
    spec = NETS[net]
    small, large = spec.dims
    t0 = time.perf_counter()
    paths = {
        "rademacher": featurize(net, root, large, "rademacher", args),
        "kronecker": featurize(net, root, 2 * large, "kronecker", args),
    }
    t1 = time.perf_counter()
    ev = evaluate(
        recipe=spec.example.train_subset,
        model=spec.example.make_model,
        targets=spec.example.target_set,
        task=spec.task,
        store=paths["rademacher"],
        model_kwargs=spec.kwargs,
        # no interval for the dense store's variants here: this benchmark bootstraps its picks
        eval=EvalConfig(
            recipe=spec.example.train_subset,
            recipe_kwargs=spec.kwargs,
            num_models=args.models,
            bootstrap=0,
        ),
        cluster=ClusterConfig(num_workers=args.workers),
        progress=False,
    )
    t2 = time.perf_counter()
    stores = {k: FeatureStore.open(p) for k, p in paths.items()}
    dims = {"rademacher": (small, large), "kronecker": (small, 2 * small, large, 2 * large)}
    grid = {"rademacher": dims["rademacher"], "kronecker": dims["kronecker"]}
    if not args.grid_2p:
        grid["kronecker"] = (small, large)
    lams = {k: dense_bench.score_variants(s, args.checkpoints, grid[k]) for k, s in stores.items()}
    for q in set(dims["kronecker"]) - set(grid["kronecker"]):
        lams["kronecker"][q] = ["auto"]  # run() scored the largest p; prefixes here
        if variant_name(q, "auto") not in stores["kronecker"].score_variants(EXP):
            ids = list(range(args.checkpoints))
            compute_scores(stores["kronecker"], ScoringConfig(EXP), ids, q, "auto")
    eval_set = stores["rademacher"].eval_set(EXP)
    assert eval_set is not None  # evaluate() wrote it
    masks, margins = eval_set.finished(args.models)
    actual = margins.astype(np.float64)
    got = {(k, p): picks(stores[k], p, lams[k][p], masks, actual) for k in dims for p in dims[k]}
    t3 = time.perf_counter()
    variants = {"dense": ("rademacher", large), "kron": ("kronecker", large)}
    variants["kron2"] = ("kronecker", 2 * large)
    ms = featurize_ms(net, root, variants, args.rounds)
    print(
        f"{net}: featurise 2 stores {t1 - t0:.0f} s, subset models {t2 - t1:.0f} s "
        f"({ev.run.trained} trained, {ev.run.reused} reused), scores + LDS {t3 - t2:.0f} s, "
        f"featurisation timing {time.perf_counter() - t3:.0f} s",
        flush=True,
    )
    model = spec.example.make_model(**spec.kwargs)
    engine = resolve_engine("auto", model, resolve_task(spec.task))
    d, n = stores["rademacher"].spec.grad_dim, stores["rademacher"].spec.train_size
    rows = []
    for p in (small, large):
        base = got["rademacher", p]
        for kind, q in (("rademacher", p), ("kronecker", p), ("kronecker", 2 * p)):
            r = got[kind, q]
            cells = [spec.label, d, n, engine, f"{p} ({'<' if p < n else '≥'} n)"]
            name = "dense" if kind == "rademacher" else ("Kronecker" if q == p else "Kronecker 2p")
            cells += [f"{name} ({q})", interval(r.auto_lds)]
            if r.best_lds is None:
                cells += ["-", "not scored"]
            else:
                cells += [f"{r.best_lam:g}", interval(r.best_lds)]
            if kind == "rademacher":
                cells += ["", ""]
            else:
                cells += [diff(base, r, actual, "auto"), diff(base, r, actual, "best")]
            if p == large:  # timed at the stores' p only
                key = "dense" if kind == "rademacher" else ("kron" if q == p else "kron2")
                cells += [f"{ms[key]:.0f}", f"{ms[key] / ms['dense']:.2f}"]
            else:
                cells += ["", ""]
            rows.append(cells)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.lds_projection", description=__doc__
    )
    parser.add_argument("--nets", nargs="+", default=["mlp128", "bert"], choices=list(NETS))
    parser.add_argument("--models", type=int, default=100, help="subset models per network")
    parser.add_argument("--checkpoints", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3, help="featurisation timing rounds")
    parser.add_argument("--grid-2p", action="store_true", help="the λ grid at 2p too")
    parser.add_argument("--out", type=Path, default=Path(".lds_bench"))
    args = parser.parse_args()
    logging.getLogger("trak_dist").setLevel(logging.ERROR)  # λ = 0 warns of its conditioning
    root = args.out.resolve()
    start = time.perf_counter()
    connect(ClusterConfig(num_workers=args.workers))  # one Ray for every run() and evaluate()
    rows = [row for net in args.nets for row in bench(net, root, args)]
    print(
        f"\nLDS of Kronecker vs dense Rademacher projection ({args.checkpoints} checkpoints; the "
        f"same {args.models} subset models at α=0.5 for both projections; 95 % bootstrap "
        f"intervals, paired for the differences; featurisation: train set, 1 checkpoint, hook "
        f"engine, 1 thread, median of {args.rounds}; {time.perf_counter() - start:.0f} s in all)"
    )
    print(
        table(
            [
                "model",
                "d",
                "n",
                "engine",
                "p",
                "projection (its p)",
                "LDS λ=auto",
                "best grid λ",
                "LDS best grid λ",
                "− dense, λ=auto",
                "− dense, best λ each",
                "featurise ms",
                "× dense",
            ],
            rows,
        )
    )


if __name__ == "__main__":
    main()
