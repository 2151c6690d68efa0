"""How ``lambda_reg=auto``'s rule and constant were chosen: the LDS of candidate λ rules.

    python -m benchmarks.lds_rules            # ~1 h on 2 busy cores; cached under --out

For the digits example's MLP, CNN and transformer (n = 1500, m = 297): 5 checkpoints featurised
at p = 2048 by TRAKer (p = 512 is its prefix), 200 subset models (α = 0.5, the subsets of
``trak_dist.store.subset_mask``, seeds 1000 + j) trained in 2 processes, and, per checkpoint,
scores for λ = c · mean eigenvalue over a fine grid of c (quarter decades, 1e-7 … 1e2), for the
first 1, 3 and 5 checkpoints: 18 LDS curves. A rule (λ as a function of each checkpoint's
spectrum) is then read off every curve (interpolated in log λ) as a fraction of the curve's
best LDS; the table gives each rule's best constant, its worst case over the 18 curves and the
range of constants whose worst case stays ≥ 0.95. The chosen rule is checked against fresh
subset models in ``benchmarks.lds``.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable
from multiprocessing import Pool
from pathlib import Path

import numpy as np
import torch

from benchmarks._table import table
from trak_dist import TRAKer
from trak_dist.examples import digits
from trak_dist.lds import spearman
from trak_dist.scoring import ensure_factor
from trak_dist.store import FeatureStore, subset_mask
from trak_dist.tasks import margin

ARCHS = ("mlp", "cnn", "transformer")
N, C, MODELS, PS = 1500, 5, 200, (512, 2048)
GRID = 10.0 ** np.arange(-7, 2.01, 0.25)  # λ / mean eigenvalue


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


def curves(store: FeatureStore, masks: np.ndarray, margins: np.ndarray) -> dict:
    """``{(p, checkpoints): (LDS per GRID value, spectra)}``."""
    m = margins.shape[1]
    out = {}
    for p in PS:
        per_ckpt, spectra = [], []
        for c in range(C):
            f = ensure_factor(store, c, p)
            e, v = f.eigenvalues, f.eigenvectors
            rows = store.train_rows(c)
            a = rows.read(0, N, p).astype(np.float64) @ v
            b = store.target_rows("targets", c).read(0, m, p).astype(np.float64) @ v
            scale = np.clip(e, 0, None).mean()
            scores = []
            for g in GRID:
                w = 1.0 / (e + g * scale)
                kinv = (v.astype(np.float32) * w.astype(np.float32)) @ v.T.astype(np.float32)
                scores.append(((a * w) @ b.T / np.abs(kinv).mean()).astype(np.float32))
            per_ckpt.append((scores, rows.read_q(0, N)))
            spectra.append(np.clip(e, 0, None))
        for k in (1, 3, 5):
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


RULES: dict[str, tuple[Callable[[np.ndarray, int, float], float], np.ndarray]] = {
    "c · largest eigenvalue (auto)": (lambda e, p, c: c * e.max(), 10 ** np.arange(-3.5, -1, 0.05)),
    "λ with c effective dimensions": (lambda e, p, c: _deff(e, c), np.arange(30, 200, 5.0)),
    "c · trace / min(n, p)": (
        lambda e, p, c: c * e.sum() / min(N, p),
        10 ** np.arange(-2, 1, 0.05),
    ),
    "c · mean eigenvalue": (lambda e, p, c: c * e.mean(), 10 ** np.arange(-2, 1, 0.05)),
    "c · sqrt(mean · largest)": (
        lambda e, p, c: c * np.sqrt(e.mean() * e.max()),
        10 ** np.arange(-2.5, 0.01, 0.05),
    ),
}


def ratios(rule: Callable, c: float, all_curves: list) -> list[float]:
    """The rule's LDS as a fraction of the best, per curve (λ/mean eigenvalue averaged over
    the curve's checkpoints, which have similar spectra, then interpolated in log λ)."""
    out = []
    for (p, _), (lds, spectra) in all_curves:
        rel = np.mean([rule(e, p, c) / e.mean() for e in spectra])
        out.append(float(np.interp(np.log(rel), np.log(GRID), lds) / lds.max()))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.lds_rules", description=__doc__)
    parser.add_argument("--out", type=Path, default=Path(".lds_bench/rules"))
    args = parser.parse_args()
    root = args.out.resolve()
    root.mkdir(parents=True, exist_ok=True)
    all_curves = []
    for arch in ARCHS:
        store = featurize(arch, root)
        all_curves += list(curves(store, *truth(arch, root)).items())
        print(f"{arch}: done", flush=True)
    rows = []
    for name, (rule, params) in RULES.items():
        worst = [min(ratios(rule, c, all_curves)) for c in params]
        best = int(np.argmax(worst))
        ok = [c for c, w in zip(params, worst, strict=True) if w >= 0.95]
        plateau = f"{min(ok):.3g} … {max(ok):.3g}" if ok else "none"
        rows.append([name, f"{params[best]:.3g}", f"{worst[best]:.3f}", plateau])
    bergson = min(ratios(RULES["c · mean eigenvalue"][0], 0.1, all_curves))
    rows.append(["Bergson's default: 0.1 · mean eigenvalue", "0.1", f"{bergson:.3f}", ""])
    print("\nλ rules: worst LDS over 18 curves (3 models × p ∈ {512, 2048} × 1, 3, 5 checkpoints)")
    print("as a fraction of each curve's best; 200 subset models")
    print(table(["rule", "best c", "worst / best", "c with worst ≥ 0.95"], rows))


if __name__ == "__main__":
    main()
