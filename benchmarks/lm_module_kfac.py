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
import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from benchmarks import _lm_score, _lm_truth, lm_data_projection
from benchmarks._lm_benches import BENCHES, LMBench
from benchmarks._lm_curvature import LogLik, SampledLM, _batches, loaded
from benchmarks._table import table
from benchmarks.lm_pipeline import cached_truth
from trak_dist.gradients import HookGradientComputer, kronecker_views
from trak_dist.projection import FactorBlock, GradBlock, KroneckerProjector
from trak_dist.tasks import resolve_task

GRID = 10.0 ** np.arange(-4, 2.01, 0.5)
REST = -1  # the key of the shared sketch's rows
ENSEMBLE_C = 1e-3


@dataclass(frozen=True)
class Options:
    k: int = 32  # per side; 0: every module whole
    rows: str = "f"  # or "loglik"
    embeddings: bool = False
    dense: bool = False
    scaling: str = "per_target"  # or "raw"
    rest: int = 0  # > 0: embeddings, tied weights, biases, norms in one shared sketch of this p
    pca: bool = False  # the factors: top-k eigenvectors of the whole C_l, C_r (LoGra's)


def _counted(fb: FactorBlock) -> Tensor:
    right = fb.right.abs().sum(-1) > 0
    return right if fb.one_hot else right & (fb.left.abs().sum(-1) > 0)


class ModuleSketch:
    """Per module (keyed by its offset): the projection factors and the factors' sums."""

    def __init__(self, opts: Options, shared: KroneckerProjector | None = None) -> None:
        self.opts = opts
        self.proj: dict[int, tuple[Tensor | None, Tensor | None]] = {}
        self.cl: dict[int, Tensor] = {}
        self.cr: dict[int, Tensor] = {}
        self.shared = shared  # ``rest``: the shared sketch, and the offsets it takes
        self.one_hot: set[int] = set()

    def _factor(self, size: int, seed: int) -> Tensor | None:
        k = self.opts.k
        if not k or size <= k:
            return None
        gen = torch.Generator().manual_seed(seed)
        return (torch.randint(0, 2, (size, k), generator=gen).float() * 2 - 1) / math.sqrt(k)

    def _sides(self, fb: FactorBlock) -> tuple[Tensor, Tensor]:
        """``[B, T, a]``, ``[B, T, b]``: the module's projected factors (counted positions)."""
        if fb.offset not in self.proj:
            self.proj[fb.offset] = (
                self._factor(fb.rows, 2 * fb.offset),
                self._factor(fb.cols, 2 * fb.offset + 1),
            )
        pl, pr = self.proj[fb.offset]
        left = torch.nn.functional.one_hot(fb.left, fb.rows) if fb.one_hot else fb.left
        left = left.float() * _counted(fb)[..., None]
        right = fb.right.float()
        return (left if pl is None else left @ pl), (right if pr is None else right @ pr)

    def blocks(self, blocks: list, fit: bool) -> dict[int, Tensor]:
        """``{offset: [B, a·b]}`` per-sample projected gradients; with ``fit`` the factors'
        sums over counted positions grow."""
        out: dict[int, Tensor] = {}
        if self.shared is not None:
            rest = [b for b in blocks if isinstance(b, GradBlock) or b.offset in self.one_hot]
            if rest:
                out[REST] = self.shared.project(rest, 0)
            blocks = [b for b in blocks if not any(b is r for r in rest)]
        for fb in blocks:
            if isinstance(fb, GradBlock):
                if self.opts.dense:
                    out[fb.offset] = fb.grad.float()
                continue
            if fb.one_hot and not self.opts.embeddings:
                continue
            lp, rp = self._sides(fb)
            out[fb.offset] = torch.einsum("bta,btc->bac", lp, rp).reshape(lp.shape[0], -1)
            if fit:
                mask = _counted(fb)
                lm, rm = lp[mask].double(), rp[mask].double()
                self.cl[fb.offset] = self.cl.get(fb.offset, 0) + lm.T @ lm
                self.cr[fb.offset] = self.cr.get(fb.offset, 0) + rm.T @ rm
        return out


def _rows(
    comp: HookGradientComputer, sketch: ModuleSketch, ids: Tensor, labels: Tensor, fit: bool
) -> dict[int, np.ndarray]:
    got: dict[int, list[Tensor]] = {}
    for batch in _batches(ids, labels, 16):
        now: dict[int, Tensor] = {}

        def sink(blocks: list, now: dict = now) -> None:
            for o, z in sketch.blocks(blocks, fit).items():
                now[o] = now[o] + z if o in now else z  # a tied weight's uses: one gradient

        comp.stream(batch, sink)
        for o, z in now.items():
            got.setdefault(o, []).append(z)
    return {o: torch.cat(v).double().numpy() for o, v in got.items()}


@dataclass
class Rotated:
    X: np.ndarray  # [n, D] rows in the factors' eigenbasis, modules concatenated
    T: np.ndarray  # [m, D]
    kfac: np.ndarray  # [D] K-FAC eigenvalues (diagonal blocks: the sampled rows' Σ g²)
    ekfac: np.ndarray  # [D] EK-FAC eigenvalues
    rest: int = 0  # the last ``rest`` columns: the shared sketch, λ by the default's rule


def _rotate(z: np.ndarray, ul: np.ndarray, ur: np.ndarray) -> np.ndarray:
    """``[N, a·b]`` blocks Z as ``U_lᵀ Z U_r``, flattened."""
    return (ul.T @ z.reshape(-1, ul.shape[0], ur.shape[0]) @ ur).reshape(len(z), -1)


def collect(bench: LMBench, state: dict, model_id: int, opts: Options) -> Rotated:
    model = loaded(bench, state)
    c = bench.corpus()
    task = LogLik() if opts.rows == "loglik" else resolve_task("causal_lm")
    comp_f = HookGradientComputer(model, task)
    comp_s = HookGradientComputer(model, SampledLM(torch.Generator().manual_seed(model_id)))
    shared = None
    if opts.rest:
        views = kronecker_views(model, comp_f.layout)
        shared = KroneckerProjector(comp_f.layout.grad_dim, opts.rest, 0, views)
    sketch = ModuleSketch(opts, shared)
    if shared is not None:  # every use of a weight that has a one-hot (embedding) use
        comp_f.stream(
            _batches(c.train[:2], c.train_labels()[:2], 2)[0],
            lambda bl: sketch.one_hot.update(
                b.offset for b in bl if isinstance(b, FactorBlock) and b.one_hot
            ),
        )
    if opts.pca and opts.k:
        _pca_factors(sketch, model, c, model_id)
    g = _rows(comp_s, sketch, c.train, c.train_labels(), True)
    x = _rows(comp_f, sketch, c.train, c.train_labels(), False)
    t = _rows(comp_f, sketch, c.targets, c.target_labels, False)
    xs, ts, kf, ek, diag = [], [], [], [], []
    rest, rest_cols = None, 0
    if REST in g:  # the shared sketch: its Gram's eigenbasis, in the modules' units
        scale = math.sqrt(_rest_norms(comp_s, sketch, c) / (g[REST] ** 2).sum())
        gr, xr, tr = (z.pop(REST) * scale for z in (g, x, t))
        e, v = np.linalg.eigh(gr.T @ gr)
        rest = (xr @ v, tr @ v, np.clip(e, 0, None))
        rest_cols = len(e)
    for o in sorted(g):
        if o not in sketch.cl:  # a dense block: whole, diagonal curvature
            diag.append((x[o], t[o], (g[o] ** 2).sum(0)))
            continue
        el, ul = np.linalg.eigh(sketch.cl[o].numpy())
        er, ur = np.linalg.eigh(sketch.cr[o].numpy())

        xs.append(_rotate(x[o], ul, ur))
        ts.append(_rotate(t[o], ul, ur))
        kf.append(np.outer(np.clip(el, 0, None), np.clip(er, 0, None)).ravel())
        ek.append((_rotate(g[o], ul, ur) ** 2).sum(0))
    kfac, ekfac = np.concatenate(kf), np.concatenate(ek)
    # C_l ⊗ C_r sums over pairs of positions; give it EK-FAC's trace (sums over documents)
    kfac *= ekfac.sum() / max(kfac.sum(), 1e-300)
    if rest is not None:
        diag.append(rest)
    return Rotated(
        np.concatenate(xs + [d[0] for d in diag], 1),
        np.concatenate(ts + [d[1] for d in diag], 1),
        np.concatenate([kfac, *(d[2] for d in diag)]),
        np.concatenate([ekfac, *(d[2] for d in diag)]),
        rest_cols,
    )


def _pca_factors(sketch: ModuleSketch, model: torch.nn.Module, c, model_id: int) -> None:  # type: ignore[no-untyped-def]
    """``sketch``'s factors: each side's top-k eigenvectors of its whole factor sum (one
    sampled-label pass with the modules whole, the same draws as the main one)."""
    whole = ModuleSketch(Options(0, embeddings=sketch.opts.embeddings))
    whole.one_hot = sketch.one_hot
    comp = HookGradientComputer(model, SampledLM(torch.Generator().manual_seed(model_id)))
    _rows(comp, whole, c.train, c.train_labels(), True)
    k = sketch.opts.k
    for o in whole.cl:
        sides = []
        for cov in (whole.cl[o], whole.cr[o]):
            vecs = torch.linalg.eigh(cov).eigenvectors.flip(1)[:, :k].float()
            sides.append(vecs if cov.shape[0] > k else None)
        sketch.proj[o] = (sides[0], sides[1])


def _rest_norms(comp: HookGradientComputer, sketch: ModuleSketch, c) -> float:  # type: ignore[no-untyped-def]
    """Σ ‖g‖² of the sampled rows' gradients in the shared sketch's blocks, unprojected: its
    rows are scaled so that their Gram's trace is this (the modules' blocks keep norms)."""
    total = 0.0

    def sink(blocks: list) -> None:
        nonlocal total
        for b in blocks:
            if isinstance(b, GradBlock) or b.offset in sketch.one_hot:
                for gb in [b] if isinstance(b, GradBlock) else b.grad_blocks():
                    total += float((gb.grad.double() ** 2).sum())

    for batch in _batches(c.train, c.train_labels(), 16):
        comp.stream(batch, sink)
    return total


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
