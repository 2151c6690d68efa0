"""Data-dependent Kronecker projections (issue 29, prototypes measured offline).

    python -m benchmarks.lm_data_projection                     # every variant, four benchmarks
    python -m benchmarks.lm_data_projection --only syn_llama_prompt --variants pca,whiten:1

EK-FAC's lead on ``syn_llama_prompt`` (0.346 against the default's 0.266) comes with full
gradients: kronfluence's plain gradient dot products (0.303) already beat every projected
variant at p ≤ 2048, so the random projection's noise is most of the gap. A module's
per-sample gradient is Σ_t l_t r_tᵀ (``FactorBlock``) and the Kronecker projection reads the
sketch Lᵀ (Σ_t l_t r_tᵀ) R, so any left / right factors give a valid projection at the same
cost. Per checkpoint, one sampled-label pass over the train set first collects each module's
factor covariances C_l = Σ l_t l_tᵀ and C_r = Σ r_t r_tᵀ (counted positions; the Fisher's
Kronecker factors, as K-FAC fits them), then the factors are:

- ``random``: today's ±1 factors (the default's projection, for reference);
- ``whiten:<d>``: C_l^{-1/2} L and C_r^{-1/2} R, damped by d × the mean eigenvalue: the sketch
  of the K-FAC-whitened gradient, so row inner products estimate gᵀ (C_l ⊗ C_r)⁻¹ g';
- ``pca``: the top-k eigenvectors of C_l and C_r (LoGra's PCA initialisation), each column
  with a random sign so that modules sharing a column do not add up coherently; ``pca:left``
  / ``pca:right`` on one side only, ``pca:permuted`` with each module's columns shuffled;
- ``adam``: the random factors with the rows of L scaled by r_i^{-1/2} · (Σ r)^{1/2} and those of
  R by c_j^{-1/2}, where r and c are the row and column sums of the matrix view of AdamW's
  second moments v at that checkpoint (``_lm_truth.adam_moments``): the sketch of the gradient
  divided by Adafactor's factored √v (TrackStar's and LESS's optimizer-aware normalisation, in
  the form that keeps the Kronecker structure); a gradient the projector forms (biases, norm
  weights, a weight whose module view is not its projection view) is divided by √v + 10⁻⁸
  exactly and projected with the plain factors.

Modules the hook engine gives no factors for (norm weights) keep ±1 factors (``whiten``
drops them: there is no C to whiten with; ``pca`` scales them by 1/√k like the unit-norm
eigenvectors). The causal-LM rows X, targets T and sampled-label rows G are projected at
p = 2048 and scored offline as the default scores: K = GᵀG, λ auto (rank bound max(n, p)),
``per_target``; "K = I" scores plain inner products of the projected rows.
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

from benchmarks import _lm_score, _lm_truth
from benchmarks._lm_benches import BENCHES, LMBench
from benchmarks._lm_curvature import SampledLM, _batches, loaded, projected_rows
from benchmarks._table import table
from benchmarks.lm_pipeline import cached_truth
from trak_dist.gradients import HookGradientComputer, kronecker_views
from trak_dist.projection import FactorBlock, GradBlock, KroneckerProjector
from trak_dist.tasks import resolve_task

P = 2048
AUTO_C = 1.25
VARIANTS = "random,whiten:0.1,whiten:1,pca,pca:left,pca:right,pca:permuted,adam"


@dataclass(frozen=True)
class Variant:
    """``random``, ``whiten:<damp>``, ``pca``, ``pca:left``, ``pca:right``, ``pca:permuted``,
    ``adam``."""

    kind: str
    damp: float = 1.0
    sides: str = "both"
    permute: bool = False

    @classmethod
    def parse(cls, text: str) -> Variant:
        kind, _, arg = text.partition(":")
        if kind == "whiten":
            return cls(kind, damp=float(arg or 1))
        if kind == "pca":
            return cls(
                kind, sides=arg if arg in ("left", "right") else "both", permute=arg == "permuted"
            )
        if kind in ("random", "adam") and not arg:
            return cls(kind)
        raise SystemExit(f"unknown variant {text!r}; expected one of {VARIANTS}")


def _counted(fb: FactorBlock) -> Tensor:
    """``[B, T]`` positions that carry a gradient (both factors non-zero)."""
    right = fb.right.abs().sum(-1) > 0
    return right if fb.one_hot else right & (fb.left.abs().sum(-1) > 0)


class Covariances:
    """Σ_t l_t l_tᵀ and Σ_t r_t r_tᵀ per factor block offset, over counted positions."""

    def __init__(self) -> None:
        self.left: dict[int, Tensor] = {}
        self.right: dict[int, Tensor] = {}
        self.count: dict[int, int] = {}

    def add(self, blocks: list) -> None:
        for fb in blocks:
            if not isinstance(fb, FactorBlock):
                continue
            mask = _counted(fb)
            r = fb.right[mask].double()
            if fb.one_hot:
                left = torch.diag(torch.bincount(fb.left[mask], minlength=fb.rows).double())
            else:
                lv = fb.left[mask].double()
                left = lv.T @ lv
            o = fb.offset
            self.left[o] = self.left.get(o, 0) + left
            self.right[o] = self.right.get(o, 0) + r.T @ r
            self.count[o] = self.count.get(o, 0) + int(mask.sum())

    def of(self, offset: int, rows: int, cols: int) -> tuple[Tensor, Tensor] | None:
        """``(C_l, C_r)`` per counted position of the module at ``offset`` if its factors are
        the view's (a narrow head is projected as a reshaped dense block instead)."""
        if offset not in self.count:
            return None
        left, right = self.left[offset], self.right[offset]
        if (left.shape[0], right.shape[0]) != (rows, cols):
            return None
        n = self.count[offset]
        return left / n, right / n


def _inv_sqrt(c: Tensor, damp: float) -> Tensor:
    e, v = torch.linalg.eigh(c)
    e = e.clamp(min=0)
    return ((v / (e + damp * e.mean()).sqrt()) @ v.T).float()


def _top(c: Tensor, k: int, gen: torch.Generator, permute: bool) -> Tensor:
    """``[n, k]``: the top-k eigenvectors of ``c`` (zero columns past its size), each times a
    random sign, shuffled if ``permute``."""
    v = torch.linalg.eigh(c).eigenvectors
    j = min(k, c.shape[0])
    signs = torch.randint(0, 2, (j,), generator=gen).double() * 2 - 1
    out = torch.zeros(c.shape[0], k, dtype=torch.float64)
    out[:, :j] = v.flip(1)[:, :j] * signs
    if permute:
        out = out[:, torch.randperm(k, generator=gen)]
    return out.float()


class DataKronecker(KroneckerProjector):
    """The Kronecker projection with ``variant``'s factors from ``cov``."""

    def configure(self, cov: Covariances, variant: Variant, second: Tensor | None = None) -> None:
        """``second``: AdamW's flat second moments in the layout's order (``adam``)."""
        self.cov, self.variant, self.second = cov, variant, second
        self._data: dict[int, tuple[Tensor, Tensor]] = {}
        self._plain = False  # ``adam``: a formed gradient, already divided by √v

    def factors(self, model_id: int, index: int) -> tuple[Tensor, Tensor]:
        left, right = super().factors(model_id, index)
        if self._plain:
            return left, right
        if index not in self._data:
            view, v = self.views[index], self.variant
            k = left.shape[1]
            cs = self.cov.of(view.offset, view.rows, view.cols)
            if v.kind == "adam":
                pair = _adafactor(
                    self._second_view(view.offset, view.numel, view.cols), left, right
                )
            elif cs is None:
                pair = (
                    (left / math.sqrt(k), right / math.sqrt(k))
                    if v.kind == "pca"
                    else (left, right)
                )
            elif v.kind == "whiten":
                pair = (_inv_sqrt(cs[0], v.damp) @ left, _inv_sqrt(cs[1], v.damp) @ right)
            else:
                gen = torch.Generator().manual_seed(1000 + index)
                tops = [_top(c, k, gen, v.permute) for c in cs]
                pair = (
                    tops[0] if v.sides != "right" else left / math.sqrt(k),
                    tops[1] if v.sides != "left" else right / math.sqrt(k),
                )
            self._data[index] = pair
        return self._data[index]

    def _second_view(self, offset: int, numel: int, cols: int) -> Tensor:
        assert self.second is not None
        v = self.second[offset : offset + numel].double()
        rows = -(-numel // cols)  # the view's zero-padded last row: padded with the mean here
        return torch.cat([v, v.mean().expand(rows * cols - numel)]).reshape(rows, cols)

    def _add_dense(self, out: Tensor, gb: GradBlock, model_id: int) -> None:
        if self.variant.kind == "adam":  # formed: divided by √v exactly, plain factors
            assert self.second is not None
            v = self.second[gb.offset : gb.offset + gb.grad.shape[1]]
            self._plain = True
            try:
                super()._add_dense(out, GradBlock(gb.offset, gb.grad / (v.sqrt() + 1e-8)), model_id)
            finally:
                self._plain = False
        elif self.variant.kind != "whiten":
            super()._add_dense(out, gb, model_id)


def _adafactor(v: Tensor, left: Tensor, right: Tensor) -> tuple[Tensor, Tensor]:
    """``left``, ``right`` with rows scaled so that Lᵀ G R sketches G / √(r cᵀ / Σ r)."""
    r, c = v.sum(1).clamp(min=1e-30), v.sum(0).clamp(min=1e-30)
    rs = (r.rsqrt() * r.sum().sqrt()).to(left.dtype)
    return rs[:, None] * left, c.rsqrt().to(right.dtype)[:, None] * right


def collect(
    bench: LMBench,
    state: dict,
    model_id: int,
    variant: Variant,
    micro: int = 16,
    moments: dict[str, Tensor] | None = None,
) -> dict:
    """``X``, ``G`` (sampled-label rows) and ``T`` of one checkpoint, projected at ``P``
    (``moments``: AdamW's second moments by parameter name, for ``adam``)."""
    model = loaded(bench, state)
    c = bench.corpus()
    comp_f = HookGradientComputer(model, resolve_task("causal_lm"))

    def sampled() -> HookGradientComputer:  # the same draws each time: seeded per checkpoint
        return HookGradientComputer(model, SampledLM(torch.Generator().manual_seed(model_id)))

    cov = Covariances()
    if variant.kind not in ("random", "adam"):
        comp_s = sampled()
        for batch in _batches(c.train, c.train_labels(), micro):
            comp_s.stream(batch, cov.add)
    proj = DataKronecker(comp_f.layout.grad_dim, P, 0, kronecker_views(model, comp_f.layout))
    second = None
    if variant.kind == "adam":
        assert moments is not None, "adam needs the checkpoint's AdamW second moments"
        second = torch.cat([moments[name].reshape(-1) for name in comp_f.layout.names])
    proj.configure(cov, variant, second)

    def rows(comp: HookGradientComputer, ids: Tensor, labels: Tensor) -> np.ndarray:
        return projected_rows(comp, proj, ids, labels, model_id, micro)

    return {
        "X": rows(comp_f, c.train, c.train_labels()),
        "G": rows(sampled(), c.train, c.train_labels()),
        "T": rows(comp_f, c.targets, c.target_labels),
    }


HEADER = ["benchmark", "factors", "K", "last: λ auto", "mean: λ auto", "mean: best (c)", "s"]


def bench_rows(name: str, variant_text: str, root: Path, models: int) -> list[list[str]]:
    metric = _lm_score.lds_metric(*cached_truth(name, root, models))
    states = _lm_truth.checkpoints(name, root)
    variant = Variant.parse(variant_text)
    t0 = time.perf_counter()
    moms = _lm_truth.adam_moments(name, root) if variant.kind == "adam" else [None] * len(states)
    got = [
        collect(BENCHES[name], st, i, variant, moments=mo)
        for i, (st, mo) in enumerate(zip(states, moms, strict=True))
    ]
    secs = time.perf_counter() - t0
    n = got[0]["X"].shape[0]
    out = []
    for label, scaling in (("GᵀG, per_target", "per_target"), ("I", "mean_abs")):
        cvs = [
            _lm_score.Curv(
                g["X"], g["T"], g["G"].T @ g["G"] if label != "I" else np.eye(P), max(n, P)
            )
            for g in got
        ]
        last, mean = _lm_score.curve(cvs, P, metric, scaling=scaling)
        out.append([name, variant_text, label, *_lm_score.cells(last, mean, AUTO_C), f"{secs:.0f}"])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.lm_data_projection", description=__doc__
    )
    ap.add_argument("--only", default="syn_llama_prompt,syn_llama,text_gpt2,text_gpt2_prompt")
    ap.add_argument("--variants", default=VARIANTS)
    ap.add_argument("--models", type=int, default=60)
    ap.add_argument("--out", type=Path, default=Path(".lds_bench/lm"))
    a = ap.parse_args()
    torch.set_num_threads(1)
    rows: list[list[str]] = []
    for name in a.only.split(","):
        for variant in a.variants.split(","):
            got = bench_rows(name, variant, a.out, a.models)
            print(table(HEADER, got), flush=True)
            rows += got
    print(table(HEADER, rows))


if __name__ == "__main__":
    main()
