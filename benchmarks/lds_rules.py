"""How ``lambda_reg=auto``'s rule and constant were chosen: the LDS of candidate λ rules.

    python -m benchmarks.lds_rules     # all six benchmarks; ~15 min on 2 quiet cores; cached
    python -m benchmarks.lds_rules --only bert,lm --models 100   # some of them, fewer models

For the digits example's MLP, CNN and transformer (n = 1500, m = 297): 5 checkpoints featurised
at p = 2048 by TRAKer (p = 512 is its prefix), 200 subset models (α = 0.5, the subsets of
``trak_dist.store.subset_mask``, seeds 1000 + j) trained in 2 processes, and, per checkpoint,
scores for λ = c · mean eigenvalue over a fine grid of c (quarter decades, 1e-7 … 1e2), for the
first 1, 3 and 5 checkpoints: 18 LDS curves. A rule (λ as a function of each checkpoint's
spectrum) is then read off every curve (interpolated in log λ) as a fraction of the curve's
best LDS; the table gives each rule's best constant, its worst case over the 18 curves and the
range of constants whose worst case stays ≥ 0.95. The chosen rule is checked against fresh
subset models in ``benchmarks.lds``.

Issue 21 adds two Hugging Face transformers (``benchmarks._transformer_benches``): ``bert``, a
BERT classifier on a noisy keyword task (n = 600, m = 100, p ∈ {512, 1024}), and ``lm``, a
GPT-2 causal LM on scikit-learn's dataset descriptions (n = 300, m = 83, p ∈ {128, 512}); 3
checkpoints each, subset models from
their own recipes through ``trak_dist.lds.SubsetTrainer`` (the task's f, as ``trak-dist eval``
measures it), curves for 1 and 3 checkpoints. A rule sees each checkpoint's spectrum of XᵀX,
n, p, and the targets' energy along each eigenvector (``Spectrum``), so that rules reading
the targets' features can be tried; the second table gives each rule's fraction of the best
per benchmark at one constant.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from multiprocessing import Pool
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks import _transformer_benches as tb
from benchmarks._table import table
from trak_dist import TRAKer
from trak_dist.config import DataConfig, EvalConfig, JobConfig, ModelConfig, TaskConfig
from trak_dist.examples import digits
from trak_dist.lds import SubsetTrainer, spearman
from trak_dist.scoring import AUTO_SCALE, auto_lambda, ensure_factor
from trak_dist.sources import batch_of
from trak_dist.store import FeatureStore, subset_mask
from trak_dist.tasks import margin

ARCHS = ("mlp", "cnn", "transformer")
N, C, MODELS, PS = 1500, 5, 200, (512, 2048)
GRID = 10.0 ** np.arange(-7, 2.01, 0.25)  # λ / mean eigenvalue


@dataclass(frozen=True)
class Bench:
    """A benchmark beyond the digits networks: a model, its task and data, and its recipe."""

    model: Callable[[], Any]
    task: str
    train: Callable[[], Any]
    targets: Callable[[], Any]
    recipe: Callable[[np.ndarray, int], dict]
    quality: Callable[[dict], str]
    checkpoints: int = 3
    proj_dims: tuple[int, ...] = (512, 1024)  # < n and ≥ n (n ≈ 600)


BENCHES = {
    "bert": Bench(
        tb.bert_model,
        "text_classification",
        tb.bert_train_set,
        tb.bert_target_set,
        tb.bert_recipe,
        tb.bert_quality,
    ),
    "bert40": Bench(
        tb.bert_model,
        "text_classification",
        partial(tb.bert_train_set, noise=0.4),
        tb.bert_target_set,
        partial(tb.bert_recipe, noise=0.4),
        tb.bert_quality,
    ),
    "lm": Bench(
        tb.lm_model,
        "causal_lm",
        tb.lm_train_set,
        tb.lm_target_set,
        tb.lm_recipe,
        tb.lm_quality,
        proj_dims=(128, 512),  # n = 300
    ),
}


@dataclass(frozen=True)
class Spectrum:
    """What a rule may read, per checkpoint: XᵀX's eigenvalues ``e`` ``[p]`` (clipped at 0),
    n, p, and ``w`` ``[p]``: the targets' mean squared feature along each eigenvector."""

    e: np.ndarray
    n: int
    p: int
    w: np.ndarray


def featurize(arch: str, root: Path) -> FeatureStore:
    path = root / f"{arch}.zarr"
    ckpts = digits.checkpoints(num=C, arch=arch, cache_dir=str(root / "cache"))
    if (path / "zarr.json").exists():
        return FeatureStore.open(path)
    train, targets = digits.train_set(), digits.target_set()
    t = TRAKer(
        model=digits.make_model(arch=arch),
        task="image_classification",
        train_set_size=N,
        save_dir=path,
        device="cpu",
        proj_dim=max(PS),
        logging_level=logging.ERROR,
    )
    for i, c in enumerate(ckpts):
        t.load_checkpoint(torch.load(c, weights_only=True), model_id=i)
        for b in range(0, N, 250):
            t.featurize(tuple(z[b : b + 250] for z in train.tensors), num_samples=min(250, N - b))
    t.finalize_features()
    for i, c in enumerate(ckpts):
        t.start_scoring_checkpoint("targets", torch.load(c, weights_only=True), i, len(targets))
        t.score(targets.tensors, num_samples=len(targets))
    return t.store


def _state(root: Path, name: str, bench: Bench, seed: int) -> dict:
    path = root / f"{name}_seed{seed}.pt"
    if not path.exists():
        n = len(bench.train())
        torch.save(bench.recipe(np.arange(n), seed), path)
    return torch.load(path, weights_only=True)


def featurize_bench(name: str, root: Path) -> FeatureStore:
    """``name``'s checkpoints (trained on the whole train set, seeds 0…) featurised by TRAKer at
    the largest p; each checkpoint's quality is printed."""
    bench = BENCHES[name]
    path = root / f"{name}.zarr"
    states = [_state(root, name, bench, s) for s in range(bench.checkpoints)]
    for s, st in enumerate(states):
        print(f"{name} checkpoint {s}: {bench.quality(st)}", flush=True)
    if (path / "zarr.json").exists():
        return FeatureStore.open(path)
    train, targets = bench.train(), bench.targets()
    n, m = len(train), len(targets)
    t = TRAKer(
        model=bench.model(),
        task=bench.task,
        train_set_size=n,
        save_dir=path,
        device="cpu",
        proj_dim=max(bench.proj_dims),
        logging_level=logging.ERROR,
    )
    for i, st in enumerate(states):
        t.load_checkpoint(st, model_id=i)
        for b in range(0, n, 200):
            t.featurize(batch_of(train, b, min(n, b + 200)), num_samples=min(200, n - b))
    t.finalize_features()
    for i, st in enumerate(states):
        t.start_scoring_checkpoint("targets", st, i, m)
        t.score(batch_of(targets, 0, m), num_samples=m)
    return t.store


def _bench_margins(args: tuple[str, int, np.ndarray]) -> np.ndarray:
    name, j, idx = args
    b = BENCHES[name]
    cfg = JobConfig(
        model=ModelConfig(factory=b.model, checkpoints=[]),
        task=TaskConfig(name=b.task),
        data=DataConfig(targets=b.targets),
        eval=EvalConfig(recipe=b.recipe, device="cpu"),
        progress=False,
    )
    return SubsetTrainer(cfg, threads=1).margins(idx, 1000 + j)


def truth_bench(name: str, root: Path, models: int) -> tuple[np.ndarray, np.ndarray]:
    """``models`` subset models (α = 0.5, seeds 1000 + j) of ``name``, cached 10 at a time, so
    that a stopped run resumes and a larger ``models`` adds to the cache."""
    path = root / f"truth_{name}.npz"
    n = len(BENCHES[name].train())
    masks = np.stack([subset_mask(n, 0.5, 0, j) for j in range(models)])
    have = list(np.load(path)["margins"]) if path.exists() else []
    if len(have) < models:
        with Pool(2) as pool:
            for j0 in range(len(have), models, 10):
                jobs = [
                    (name, j, np.flatnonzero(masks[j])) for j in range(j0, min(models, j0 + 10))
                ]
                have += pool.map(_bench_margins, jobs)
                np.savez(path, margins=np.stack(have))
                print(f"{name}: {len(have)} subset models", flush=True)
    return masks, np.stack(have[:models])


def _margins(args: tuple[str, int, np.ndarray]) -> np.ndarray:
    arch, j, idx = args
    torch.set_num_threads(1)
    model = digits.make_model(arch=arch)
    model.load_state_dict(digits.train_subset(idx, 1000 + j, arch=arch))
    xt, yt = digits.target_set().tensors
    with torch.no_grad():
        return margin(model.eval()(xt), yt).numpy()


def truth(arch: str, root: Path) -> tuple[np.ndarray, np.ndarray]:
    path = root / f"truth_{arch}.npz"
    if not path.exists():
        masks = np.stack([subset_mask(N, 0.5, 0, j) for j in range(MODELS)])
        with Pool(2) as pool:
            jobs = [(arch, j, np.flatnonzero(masks[j])) for j in range(MODELS)]
            np.savez(path, masks=masks, margins=np.stack(pool.map(_margins, jobs)))
    z = np.load(path)
    return z["masks"], z["margins"]


def curves(
    store: FeatureStore, masks: np.ndarray, margins: np.ndarray, ps: tuple[int, ...] = PS
) -> dict:
    """``{(p, checkpoints): (LDS per GRID value, Spectrum per checkpoint)}``."""
    n, m = store.spec.train_size, margins.shape[1]
    ckpts = len(store.checkpoint_ids())
    out = {}
    for p in ps:
        per_ckpt, spectra = [], []
        for c in range(ckpts):
            f = ensure_factor(store, c, p)
            e, v = f.eigenvalues, f.eigenvectors
            rows = store.train_rows(c)
            a = rows.read(0, n, p).astype(np.float64) @ v
            b = store.target_rows("targets", c).read(0, m, p).astype(np.float64) @ v
            scale = np.clip(e, 0, None).mean()
            scores = []
            for g in GRID:
                w = 1.0 / (e + g * scale)
                kinv = (v.astype(np.float32) * w.astype(np.float32)) @ v.T.astype(np.float32)
                scores.append(((a * w) @ b.T / np.abs(kinv).mean()).astype(np.float32))
            per_ckpt.append((scores, rows.read_q(0, n)))
            spectra.append(Spectrum(np.clip(e, 0, None), n, p, (b * b).mean(0)))
        for k in (1, 3, 5):
            if k > ckpts:
                continue
            qbar = np.mean([q for _, q in per_ckpt[:k]], 0)
            lds = []
            for i in range(len(GRID)):
                s = np.mean([sc[i] for sc, _ in per_ckpt[:k]], 0) * qbar[:, None]
                lds.append(np.nanmean(spearman(masks.astype(np.float64) @ s, margins)))
            out[(p, k)] = (np.array(lds), spectra[:k])
    return out


def _deff(e: np.ndarray, k: float) -> float:
    """λ with Σ e/(e+λ) = k (bisection in log λ)."""
    lo, hi = 1e-12 * e.max(), 1e6 * e.max()
    for _ in range(200):
        mid = np.sqrt(lo * hi)
        lo, hi = (mid, hi) if (e / (e + mid)).sum() > k else (lo, mid)
    return float(mid)


def _target_share(s: Spectrum, c: float) -> float:
    """λ at which the targets' energy is resolved to a fraction c: Σ w e/(e+λ) = c Σ w."""
    lo, hi = 1e-12 * s.e.max(), 1e6 * s.e.max()
    for _ in range(200):
        mid = np.sqrt(lo * hi)
        share = (s.w * s.e / (s.e + mid)).sum() / s.w.sum()
        lo, hi = (mid, hi) if share > c else (lo, mid)
    return float(mid)


Rule = Callable[[Spectrum, float], float]
RULES: dict[str, tuple[Rule, np.ndarray]] = {
    "c · largest eigenvalue": (lambda s, c: c * s.e.max(), 10 ** np.arange(-4, -1, 0.05)),
    "λ with c effective dimensions": (lambda s, c: _deff(s.e, c), np.arange(10, 300, 5.0)),
    "c · trace / min(n, p)": (
        lambda s, c: c * s.e.sum() / min(s.n, s.p),
        10 ** np.arange(-2.5, 1, 0.05),
    ),
    "c · mean eigenvalue": (lambda s, c: c * s.e.mean(), 10 ** np.arange(-2.5, 1, 0.05)),
    "c · sqrt(mean · largest)": (
        lambda s, c: c * np.sqrt(s.e.mean() * s.e.max()),
        10 ** np.arange(-3, 0.01, 0.05),
    ),
    "λ resolving a share c of the targets' energy": (_target_share, np.arange(0.5, 0.996, 0.005)),
}
# the constants the peers and trak_dist use, for the per-benchmark table
FIXED = [
    (f"auto: {AUTO_SCALE:g} · trace / min(n, p)", "c · trace / min(n, p)", AUTO_SCALE),
    ("auto before issue 21: 0.007 · largest eigenvalue", "c · largest eigenvalue", 0.007),
    ("Bergson/kronfluence: 0.1 · mean eigenvalue", "c · mean eigenvalue", 0.1),
]


def ratios(rule: Callable, c: float, all_curves: list) -> list[float]:
    """The rule's LDS as a fraction of the best, per curve (λ/mean eigenvalue averaged over
    the curve's checkpoints, which have similar spectra, then interpolated in log λ)."""
    out = []
    for _, (_, _), (lds, spectra) in all_curves:
        rel = np.mean([rule(sp, c) / sp.e.mean() for sp in spectra])
        out.append(float(np.interp(np.log(rel), np.log(GRID), lds) / lds.max()))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.lds_rules", description=__doc__)
    parser.add_argument("--out", type=Path, default=Path(".lds_bench/rules"))
    names = [*ARCHS, *BENCHES]
    parser.add_argument("--only", default=",".join(names), help=f"of {names}")
    parser.add_argument("--models", type=int, default=MODELS, help="subset models (transformers)")
    args = parser.parse_args()
    root = args.out.resolve()
    root.mkdir(parents=True, exist_ok=True)
    chosen = [x for x in args.only.split(",") if x]
    unknown = sorted(set(chosen) - set(names))
    if unknown:
        parser.error(f"--only: unknown benchmarks {unknown}; known: {names}")
    all_curves = []  # (benchmark, (p, checkpoints), (LDS per GRID value, spectra))
    for name in chosen:
        if name in ARCHS:
            store, (masks, margins), ps = featurize(name, root), truth(name, root), PS
        else:
            store = featurize_bench(name, root)
            masks, margins = truth_bench(name, root, args.models)
            ps = BENCHES[name].proj_dims
        for key, curve in curves(store, masks, margins, ps).items():
            all_curves.append((name, key, curve))
        print(f"{name}: done", flush=True)
    print_curves(all_curves)
    rows = []
    for name, (rule, params) in RULES.items():
        worst = [min(ratios(rule, c, all_curves)) for c in params]
        best = int(np.argmax(worst))
        ok = [c for c, w in zip(params, worst, strict=True) if w >= 0.95]
        plateau = f"{min(ok):.3g} … {max(ok):.3g}" if ok else "none"
        rows.append([name, f"{params[best]:.3g}", f"{worst[best]:.3f}", plateau])
    print(
        f"\nλ rules: worst LDS over {len(all_curves)} curves ({', '.join(chosen)}; p < n "
        "and p ≥ n; 1, 3(, 5) checkpoints) as a fraction of each curve's best"
    )
    print(table(["rule", "best c", "worst / best", "c with worst ≥ 0.95"], rows))
    print_per_bench(all_curves, chosen)


def _best_c(rule: Rule, params: np.ndarray, all_curves: list) -> float:
    return float(params[int(np.argmax([min(ratios(rule, c, all_curves)) for c in params]))])


def print_per_bench(all_curves: list, chosen: list[str]) -> None:
    """Each rule (at its best worst-case constant here, and the fixed constants in use) as the
    worst fraction of the best LDS over each benchmark's curves."""
    entries = [
        (f"{n} (c = {_best_c(r, ps, all_curves):.3g})", r, _best_c(r, ps, all_curves))
        for n, (r, ps) in RULES.items()
    ]
    entries += [(label, RULES[rule][0], c) for label, rule, c in FIXED]
    rows = []
    for label, rule, c in entries:
        per = []
        for name in chosen:
            mine = [cv for cv in all_curves if cv[0] == name]
            per.append(f"{min(ratios(rule, c, mine)):.3f}")
        rows.append([label, *per])
    print("\nworst fraction of the best LDS per benchmark (over its p and checkpoint counts)")
    print(table(["rule", *chosen], rows))


def print_curves(all_curves: list) -> None:
    """Each curve's best LDS, where it peaks and what auto gets (λ as multiples of auto's)."""
    rows = []
    for name, (p, k), (lds, spectra) in all_curves:
        auto = np.mean([auto_lambda(sp.e, sp.n) / sp.e.mean() for sp in spectra])
        at_auto = float(np.interp(np.log(auto), np.log(GRID), lds))
        i = int(np.argmax(lds))
        rows.append(
            [
                name,
                p,
                k,
                f"{lds.max():.3f}",
                f"{GRID[i] / auto:.3g}",
                f"{at_auto:.3f}",
                f"{at_auto / lds.max():.3f}",
                f"{lds[0]:.3f}",
                f"{lds[-1]:.3f}",
            ]
        )
    print("\nLDS curves over λ (λ as a multiple of the auto λ)")
    print(
        table(
            [
                "benchmark",
                "p",
                "checkpoints",
                "best LDS",
                "best λ / auto λ",
                "LDS at auto",
                "auto / best",
                "LDS at smallest λ",
                "LDS at largest λ",
            ],
            rows,
        )
    )


if __name__ == "__main__":
    main()
