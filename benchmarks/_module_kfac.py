"""Rows of ``lm_module_kfac``'s per-module sketch and their (E)K-FAC eigenbasis, one checkpoint
at a time (the method is described there)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from benchmarks._lm_benches import LMBench
from benchmarks._lm_curvature import LogLik, SampledLM, _batches, loaded
from benchmarks.lm_data_projection import _counted
from trak_dist.gradients import HookGradientComputer, kronecker_views
from trak_dist.projection import FactorBlock, GradBlock, KroneckerProjector
from trak_dist.tasks import resolve_task

REST = -1  # the key of the shared sketch's rows


@dataclass(frozen=True)
class Options:
    k: int = 32  # per side; 0: every module whole
    rows: str = "f"  # or "loglik"
    embeddings: bool = False
    dense: bool = False
    scaling: str = "per_target"  # or "raw"
    rest: int = 0  # > 0: embeddings, tied weights, biases, norms in one shared sketch of this p
    pca: bool = False  # the factors: top-k eigenvectors of the whole C_l, C_r (LoGra's)


class ModuleSketch:
    """Per module (keyed by its offset): the projection factors and the factors' sums."""

    def __init__(self, opts: Options, shared: KroneckerProjector | None = None) -> None:
        self.opts = opts
        self.proj: dict[int, tuple[Tensor | None, Tensor | None]] = {}
        self.cl: dict[int, Tensor] = {}
        self.cr: dict[int, Tensor] = {}
        self.shared = shared  # ``rest``: the shared sketch, and the offsets it takes
        self.one_hot: set[int] = set()
        self.rest_norm = 0.0  # Σ ‖g‖² of the shared sketch's blocks, unprojected, when fitting

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

    def _is_rest(self, block: GradBlock | FactorBlock) -> bool:
        """Whether the shared sketch takes ``block``: a bias or norm weight, or a weight with
        an embedding (one-hot) use."""
        return isinstance(block, GradBlock) or block.offset in self.one_hot

    def blocks(self, blocks: list, fit: bool) -> dict[int, Tensor]:
        """``{offset: [B, a·b]}`` per-sample projected gradients; with ``fit`` the factors'
        sums over counted positions grow."""
        out: dict[int, Tensor] = {}
        if self.shared is not None:
            rest = [b for b in blocks if self._is_rest(b)]
            blocks = [b for b in blocks if not self._is_rest(b)]
            if rest:
                out[REST] = self.shared.project(rest, 0)
                if fit:
                    self.rest_norm += sum(_squared_norm(b) for b in rest)
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


def _squared_norm(block: GradBlock | FactorBlock) -> float:
    """Σ over the batch of ‖g‖² of the block's per-sample gradients, formed."""
    parts = [block] if isinstance(block, GradBlock) else block.grad_blocks()
    return sum(float((p.grad.double() ** 2).sum()) for p in parts)


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
        scale = math.sqrt(sketch.rest_norm / (g[REST] ** 2).sum())
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
