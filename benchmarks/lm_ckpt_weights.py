"""How the checkpoints' scores are weighted in their mean (issue 29): trak_dist rescales each
checkpoint's K_λ⁻¹ by its mean |entry|; kronfluence's EK-FAC gains far more from averaging
checkpoints than trak_dist's default does (``syn_llama``: 0.455 → 0.599 against 0.413 → 0.499).

    python -m benchmarks.lm_ckpt_weights [--only syn_llama,text_gpt2,text_gpt2_prompt,facts]

Reads the default's own features from ``lm_pipeline``'s stores (``pipeline_fisher.zarr``:
Kronecker p = 2048, K = GᵀG) and scores them offline at every c of λ's grid, the checkpoints
weighted as:

- ``mean |K⁻¹|``: S_c = X_c K_c⁻¹ T_cᵀ / mean|K_c⁻¹| (trak_dist today);
- ``‖S‖_F``: S_c / ‖S_c‖_F, every checkpoint's scores the same size (computable from XᵀX:
  ‖S_c‖_F² = Σ_t y_tᵀ X_cᵀX_c y_t);
- ``per target``: each target's column of S_c divided by its norm;
- ``raw``: S_c as it is;
- ``per target, by K``: each target's column divided by √(y_tᵀ K_c y_t), K_c the stored
  curvature (GᵀG): no XᵀX needed, the reducer has K_c and Y_c.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from benchmarks import _lm_score
from benchmarks._facts_bench import FactsBench
from benchmarks._table import table
from benchmarks.lm_pipeline import cached_truth, stored_curvatures

AUTO_C = 1.25
WEIGHTS = ("mean |K⁻¹|", "‖S‖_F", "per target", "raw", "per target, by K")


def per_checkpoint(
    cv: _lm_score.Curv, grid: np.ndarray, p: int | None = None
) -> dict[str, list[np.ndarray]]:
    """Scores per c of ``grid`` under every weighting, at the first ``p`` columns."""
    if p is not None:
        cv = _lm_score.Curv(cv.X[:, :p], cv.T[:, :p], cv.K[:p, :p], cv.rank)
    e, v = np.linalg.eigh(cv.K)
    e = np.clip(e, 0, None)
    unit = e.sum() / min(cv.rank, len(e))
    a, b = cv.X @ v, cv.T @ v
    rows = np.random.default_rng(0).choice(len(e), min(len(e), 64), replace=False)
    out: dict[str, list[np.ndarray]] = {w: [] for w in WEIGHTS}
    for c in grid:
        w = 1.0 / (e + c * unit)
        s = (a * w) @ b.T
        out["raw"].append(s)
        out["mean |K⁻¹|"].append(s / np.abs((v[rows] * w) @ v.T).mean())
        out["‖S‖_F"].append(s / np.linalg.norm(s))
        out["per target"].append(s / np.linalg.norm(s, axis=0, keepdims=True))
        y = b * w  # the targets' K_λ⁻¹ t in the eigenbasis
        out["per target, by K"].append(s / np.sqrt(((y * y) * e).sum(1))[None, :])
    return out


def add_curves(
    root: Path, name: str, cvs: list, metric, grid: np.ndarray, full: list[dict]
) -> None:
    """``<name>|pertarget|<p>|last`` and ``|mean`` into ``root/pipeline_curves.npz``; ``full``:
    ``per_checkpoint`` of ``cvs`` at the stored width, already computed."""
    path = root / "pipeline_curves.npz"
    curves = dict(np.load(path)) if path.exists() else {}
    width = cvs[0].X.shape[1]
    for p in (512, 1024, 2048):
        at_p = full if p == width else [per_checkpoint(cv, grid, p) for cv in cvs]
        per = [pc["per target, by K"] for pc in at_p]
        n = len(grid)
        curves[f"{name}|pertarget|{p}|last"] = np.array([metric(per[-1][i]) for i in range(n)])
        mean = [metric(np.mean([pc[i] for pc in per], 0)) for i in range(n)]
        curves[f"{name}|pertarget|{p}|mean"] = np.array(mean)
    np.savez(path, **curves)


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.lm_ckpt_weights", description=__doc__)
    ap.add_argument("--only", default="syn_llama,text_gpt2,text_gpt2_prompt,facts")
    ap.add_argument("--models", type=int, default=60)
    ap.add_argument("--out", type=Path, default=Path(".lds_bench/lm"))
    ap.add_argument(
        "--curves",
        action="store_true",
        help="also add the per_target curves (p 512/1024/2048, last and mean) to each "
        "benchmark's pipeline_curves.npz as variant 'pertarget' (lambda_lobo --pipeline pertarget)",
    )
    a = ap.parse_args()
    grid = _lm_score.GRID
    rows = []
    for name in a.only.split(","):
        if name == "facts":
            metric = FactsBench(a.out).mrr
        else:
            metric = _lm_score.lds_metric(*cached_truth(name, a.out, a.models))

        cvs = stored_curvatures(a.out / name / "pipeline_fisher.zarr")
        per = [per_checkpoint(cv, grid) for cv in cvs]
        if a.curves:
            add_curves(a.out / name, name, cvs, metric, grid, per)
        last = np.array([metric(s) for s in per[-1]["raw"]])
        for w in WEIGHTS:
            mean = np.array(
                [metric(np.mean([pc[w][i] for pc in per], 0)) for i in range(len(grid))]
            )
            rows.append([name, w, *_lm_score.cells(last, mean, AUTO_C, grid)])
            print(" | ".join(rows[-1]), flush=True)
    print(table(["benchmark", "weights", "last, auto", "mean, auto", "mean, best (c)"], rows))


if __name__ == "__main__":
    main()
