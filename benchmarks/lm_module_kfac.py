"""Per-module Kronecker projection with (E)K-FAC curvature in the projected space (issue 29,
a prototype measured offline).

    python -m benchmarks.lm_module_kfac                          # 4 benchmarks, k = whole, 32, 16
    python -m benchmarks.lm_module_kfac --rows loglik --scaling raw --ks 0   # = kronfluence EK-FAC
    python -m benchmarks.lm_module_kfac --ks 32 --embeddings --ensemble 0.5,1,2
    python -m benchmarks.lm_module_kfac --ks 32,16 --rest 2048    # the hybrid

What it found is in benchmarks/RESULTS.md, "Eighth session".

The default's sketch sums every module into p = 2048 shared columns, so its curvature is one
p × p Gram and its noise is relative to the whole gradient's norm. EK-FAC (kronfluence) keeps
each module apart: a module's curvature is Kronecker-factored, C_l ⊗ C_r (K-FAC), with its
eigenvalues re-fitted in the factors' eigenbasis (EK-FAC). Here each module of the hook
engine's factor blocks (every ``nn.Linear``; the embeddings with ``--embeddings``; biases and
norm weights, whole with a diagonal curvature, with ``--dense``) is projected on its own,
LoGra's way: its per-sample gradient Σ_t l_t r_tᵀ becomes Σ_t (Lᵀl_t)(Rᵀr_t)ᵀ, an a × b block
with a = min(rows, k), b = min(cols, k) and ±1/√k factors; a side no larger than k is kept
whole, so ``k = 0`` ("whole") is EK-FAC on full gradients. C_l and C_r are summed in the
projected space over the counted positions of one sampled-label pass (one draw per position,
as kronfluence and the default's Fisher draw), and the EK-FAC eigenvalues are the sum over
documents of the squared rotated sampled gradient. No p × p matrix: a module's curvature is an
a × a and a b × b factor and a · b eigenvalues, so the columns can number far more than 2048.

Scores: rotate each module's rows X and targets T into its factors' eigenbasis, weight by
1 / (eigenvalue + λ), λ = c × the mean eigenvalue over all modules (c on a half-decade grid),
and sum over modules; checkpoints are combined ``per_target`` (each target's column divided by
√(yᵀ K y)), as the causal-LM default, or ``raw`` (kronfluence's plain mean). Rows: trak_dist's
``causal_lm`` f (margins) for X and T, or with ``--rows loglik`` the documents' own
log-likelihood (kronfluence's train loss). ``--ensemble β…`` adds, per target, β × the
standardised EK-FAC scores (c = 10⁻³) to the standardised scores of the default's own sketch
(Kronecker p = 2048 summed over modules, K = GᵀG, λ auto, ``per_target``; the same prototype
as ``lm_data_projection``'s ``random``), to see whether the two structures' errors cancel.
``--rest p`` (the hybrid) keeps the linear modules per module and puts every other block
(embeddings, any weight with an embedding use, biases, norm weights) in one Kronecker sketch of
p columns summed as the default's, its rows scaled so that its Gram's trace is the blocks'
exact Σ‖g‖², with its own full GᵀG and the default's λ (1.25 · tr / p) whatever c is.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks import _lm_score, _lm_truth, lm_data_projection
from benchmarks._lm_benches import BENCHES, LMBench
from benchmarks._module_kfac import Options, Rotated, collect
from benchmarks._table import table
from benchmarks.lm_pipeline import cached_truth

GRID = 10.0 ** np.arange(-4, 2.01, 0.5)
ENSEMBLE_C = 1e-3


def scores_over_grid(
    r: Rotated, eig: np.ndarray, grid: np.ndarray, scaling: str
) -> list[np.ndarray]:
    """``[n, m]`` per c of ``grid``: Σ_modules X_rot diag(1 / (eig + λ)) T_rotᵀ."""
    out = []
    own = len(eig) - r.rest
    for c in grid:
        lam = np.full(len(eig), c * eig[:own].mean())
        # the shared sketch's Gram has rank ≤ n: λ = 1.25 · tr / p, the default's auto
        lam[own:] = 1.25 * eig[own:].sum() / max(r.rest, 1)
        w = 1.0 / (eig + lam)
        y = r.T * w
        norm = np.sqrt((y * y * eig).sum(1)) if scaling == "per_target" else np.ones(len(y))
        out.append((r.X * w) @ r.T.T / np.where(norm > 0, norm, 1.0)[None, :])
    return out


def _default_scores(bench: LMBench, state: dict, model_id: int) -> np.ndarray:
    """The default's sketch (``lm_data_projection``'s ``random``) at λ auto, ``per_target``."""
    g = lm_data_projection.collect(bench, state, model_id, lm_data_projection.Variant("random"))
    p = lm_data_projection.P
    cv = _lm_score.Curv(g["X"], g["T"], g["G"].T @ g["G"], max(len(g["X"]), p))
    return _lm_score._scores_over_grid(cv, p, np.array([1.25]), "per_target")[0]


def _z(s: np.ndarray) -> np.ndarray:
    return (s - s.mean(0)) / np.where(s.std(0) > 0, s.std(0), 1.0)


def _last_mean(metric, per: list[np.ndarray]) -> str:  # type: ignore[no-untyped-def]
    return f"{metric(per[-1]):.3f} / {metric(np.mean(per, 0)):.3f}"


HEADER = ["benchmark", "k", "options", "curvature", "columns", "last: best (c)", "mean: best (c)"]
HEADER += ["mean at c = 1e-4, 0.01, 1", "s"]


def bench_rows(
    name: str, opts: Options, root: Path, models: int, ensemble: list[float]
) -> list[list[str]]:
    metric = _lm_score.lds_metric(*cached_truth(name, root, models))
    states = _lm_truth.checkpoints(name, root)
    t0 = time.perf_counter()
    got = [collect(BENCHES[name], st, i, opts) for i, st in enumerate(states)]
    secs = time.perf_counter() - t0
    flags = f"{opts.rows}, {opts.scaling}" + ", emb" * opts.embeddings + ", dense" * opts.dense
    flags += f", rest {opts.rest}" if opts.rest else ""
    flags += ", pca" if opts.pca else ""
    head = [name, str(opts.k or "whole"), flags]
    out = []
    for curv in ("kfac", "ekfac"):
        per = [scores_over_grid(r, getattr(r, curv), GRID, opts.scaling) for r in got]
        last = np.array([metric(s) for s in per[-1]])
        mean = np.array([metric(np.mean([pc[i] for pc in per], 0)) for i in range(len(GRID))])
        bl, bm = int(np.argmax(last)), int(np.argmax(mean))
        pick = ", ".join(f"{_lm_score.at(mean, c, GRID):.3f}" for c in (1e-4, 0.01, 1.0))
        best_last = f"{last[bl]:.3f} ({GRID[bl]:.3g})"
        best_mean = f"{mean[bm]:.3f} ({GRID[bm]:.3g})"
        columns = str(got[0].X.shape[1])
        out.append([*head, curv, columns, best_last, best_mean, pick, f"{secs:.0f}"])
    if ensemble:
        ek = [
            _z(scores_over_grid(r, r.ekfac, np.array([ENSEMBLE_C]), opts.scaling)[0]) for r in got
        ]
        de = [_z(_default_scores(BENCHES[name], st, i)) for i, st in enumerate(states)]
        out.append([*head, "default's sketch", "2048", _last_mean(metric, de), "", "", ""])
        for beta in ensemble:
            mix = [a + beta * b for a, b in zip(de, ek, strict=True)]
            out.append([*head, f"default + {beta:g} × EK-FAC", "", _last_mean(metric, mix)])
            out[-1] += ["", "", ""]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.lm_module_kfac", description=__doc__)
    ap.add_argument("--only", default="syn_llama_prompt,syn_llama,text_gpt2,text_gpt2_prompt")
    ap.add_argument("--ks", default="0,32,16", help="per-side caps; 0: whole modules")
    ap.add_argument("--rows", default="f", choices=("f", "loglik"))
    ap.add_argument("--scaling", default="per_target", choices=("per_target", "raw"))
    ap.add_argument("--embeddings", action="store_true")
    ap.add_argument("--dense", action="store_true")
    ap.add_argument("--rest", type=int, default=0, help="p of the shared sketch (0: none)")
    ap.add_argument("--pca", action="store_true", help="PCA factors in place of ±1/√k ones")
    ap.add_argument("--ensemble", default="", help="weights β of EK-FAC beside the default")
    ap.add_argument("--models", type=int, default=60)
    ap.add_argument("--out", type=Path, default=Path(".lds_bench/lm"))
    a = ap.parse_args()
    torch.set_num_threads(1)
    ensemble = [float(b) for b in a.ensemble.split(",") if b]
    rows: list[list[str]] = []
    for name in a.only.split(","):
        for k in a.ks.split(","):
            opts = Options(int(k), a.rows, a.embeddings, a.dense, a.scaling, a.rest, a.pca)
            got = bench_rows(name, opts, a.out, a.models, ensemble)
            print(table(HEADER, got), flush=True)
            rows += got
    print(table(HEADER, rows))


if __name__ == "__main__":
    main()
