"""Prototype curvatures in the projected space (issue 29), from one pass per checkpoint.

With the Kronecker projection a module's per-sample gradient arrives as factors (inputs x_t and
output gradients δ_t per position t), and column j of the projection reads the pair (u_j, v_j)
of the sketch (Lᵀx_t)(Rᵀδ_t)ᵀ: so each position's share of a document's projected gradient,
φ_t[j] = (Lᵀx_t)[u_j] · (Rᵀδ_t)[v_j], costs no more than the row itself (x = Σ_t φ_t).
``collect`` runs the hook engine over a checkpoint and keeps, per proj_dim prefix:

- ``X`` ``[n, p]``: TRAK's rows (the ``causal_lm`` task's f = Σ margins), ``T`` ``[m, p]`` the
  targets' rows: as trak_dist's Kronecker store would hold them (scaled by 1/√d);
- ``H_f`` ``[p, p]``: Σ_docs Σ_t φ_t φ_tᵀ of the same backward (token-level, no extra pass);
- ``G`` ``[n, p]``: rows of the summed log-likelihood of labels sampled from the model (one
  draw per token), whose Gram GᵀG is an unbiased estimate of the token-level Fisher;
- ``H_s`` ``[p, p]``: Σ_t φ_t φ_tᵀ of that sampled backward (KFAC's "expand" view of it).

Parameters whose module gives no factors (norm weights, biases) contribute one term per
document (their per-sample gradient) to both H's.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor, nn

from benchmarks._lm_benches import LMBench
from trak_dist.gradients import HookGradientComputer, ParamLayout, kronecker_views
from trak_dist.projection import FactorBlock, GradBlock, KroneckerProjector
from trak_dist.projection._kron_views import shell_pairs
from trak_dist.tasks import resolve_task


class TokenKronecker(KroneckerProjector):
    """A Kronecker projector that also keeps each position's share of the last rows."""

    def begin(self, batch: int, positions: int) -> None:
        self.pos = torch.zeros(batch, positions, self.proj_dim)
        self.extra = torch.zeros(batch, self.proj_dim)
        u, v = shell_pairs(self.proj_dim)
        self._u, self._v = u, v

    def _add_factors(self, out: Tensor, fb: FactorBlock, model_id: int) -> None:
        index = self._index_of(fb.offset)
        view = self.views[index] if index >= 0 else None
        if view is None or (view.offset, view.rows, view.cols) != (fb.offset, fb.rows, fb.cols):
            before = out.clone()
            super()._add_factors(out, fb, model_id)
            self.extra += out - before
            return
        left, right = self.factors(model_id, index)
        y = fb.right.float() @ right  # [B, T, k]
        x = left[fb.left] if fb.one_hot else fb.left.float() @ left
        phi = x[..., self._u] * y[..., self._v]  # [B, T, p]
        self.pos[:, : phi.shape[1]] += phi
        out += phi.sum(1)

    def _add_dense(self, out: Tensor, gb: GradBlock, model_id: int) -> None:
        before = out.clone()
        super()._add_dense(out, gb, model_id)
        self.extra += out - before


class SampledLM:
    """``get_outputs``: Σ_t log p(ŷ_t) over counted tokens, ŷ_t drawn from the model (detached)."""

    def __init__(self, gen: torch.Generator) -> None:
        self.base = resolve_task("causal_lm")
        self.gen = gen

    def get_outputs(self, model: nn.Module, batch: dict) -> Tensor:
        inputs, _, counted = self.base._split(batch)
        z = model(**inputs).logits[:, :-1].float()
        with torch.no_grad():
            probs = torch.softmax(z, -1).reshape(-1, z.shape[-1])
            draw = torch.multinomial(probs, 1, generator=self.gen).view(counted.shape)
        logp = torch.log_softmax(z, -1).gather(-1, draw.unsqueeze(-1)).squeeze(-1)
        return torch.where(counted, logp, 0).sum(1)


class LogLik:
    """``get_outputs``: Σ_t log p(y_t) over the counted tokens of the data itself. Since
    log p = −log(1 + e^{−margin}), its gradient is Σ_t (1 − p_t) ∇margin_t: the document's
    loss gradient, each token weighted by its own 1 − p_t (``causal_lm``'s f weighs every token
    alike and its Q is one number per document)."""

    def __init__(self) -> None:
        self.base = resolve_task("causal_lm")

    def get_outputs(self, model: nn.Module, batch: dict) -> Tensor:
        inputs, targets, counted = self.base._split(batch)
        z = model(**inputs).logits[:, :-1].float()
        logp = torch.log_softmax(z, -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        return torch.where(counted, logp, 0).sum(1)


def collect_loglik(
    bench: LMBench,
    state: dict,
    model_id: int,
    p: int,
    micro: int = 16,
    task: str = "loglik",
    with_gram: bool = True,
) -> dict:
    """``X`` ``[n, p]``, ``T`` ``[m, p]`` of :class:`LogLik` (or, with ``task="causal_lm"``,
    trak_dist's f; train and targets) and the token-level Gram ``H`` of the same backward,
    Kronecker at ``p``."""
    model = loaded(bench, state)
    c = bench.corpus()
    if task == "sampled":  # the Fisher's rows G; one draw per token, seeded per checkpoint
        chosen: object = SampledLM(torch.Generator().manual_seed(model_id))
    else:
        chosen = LogLik() if task == "loglik" else resolve_task(task)
    comp = HookGradientComputer(model, chosen)
    proj = TokenKronecker(comp.layout.grad_dim, p, 0, kronecker_views(model, comp.layout))
    scale = math.sqrt(comp.layout.grad_dim)
    gram = torch.zeros(p, p, dtype=torch.float64)

    def rows(ids: Tensor, labels: Tensor, keep: bool) -> np.ndarray:
        out = []
        for batch in _batches(ids, labels, micro):
            b = batch["input_ids"]
            proj.begin(b.shape[0], b.shape[1])
            acc = torch.zeros(b.shape[0], p)
            comp.stream(batch, lambda blocks, acc=acc: acc.add_(proj.project(blocks, model_id)))
            if keep and with_gram:
                phi = (proj.pos / scale).reshape(-1, p)
                e = proj.extra / scale
                gram.add_((phi.T @ phi + e.T @ e).double())
            out.append(acc / scale)
        return torch.cat(out).double().numpy()

    x = rows(c.train, c.train_labels(), True)
    t = rows(c.targets, c.target_labels, False)
    return {"X": x, "T": t, "H": gram.numpy()}


@dataclass
class Collected:
    X: np.ndarray
    T: np.ndarray
    G: np.ndarray
    H_f: np.ndarray
    H_s: np.ndarray
    seconds: dict


def loaded(bench: LMBench, state: dict) -> nn.Module:
    """``bench``'s model with ``state``, in eval mode (seeded: the same modules every time)."""
    torch.manual_seed(0)
    model = bench.model()
    model.load_state_dict(state)
    return model.eval()


def projected_rows(
    comp: HookGradientComputer,
    proj: KroneckerProjector,
    ids: Tensor,
    labels: Tensor,
    model_id: int,
    micro: int = 16,
) -> np.ndarray:
    """``[len(ids), p]`` float64: ``comp``'s per-sample gradients through ``proj``, scaled by
    1/√d as trak_dist's store holds them."""
    scale = math.sqrt(comp.layout.grad_dim)
    out = []
    for batch in _batches(ids, labels, micro):
        acc = torch.zeros(batch["input_ids"].shape[0], proj.proj_dim)
        comp.stream(batch, lambda blocks, acc=acc: acc.add_(proj.project(blocks, model_id)))
        out.append(acc / scale)
    return torch.cat(out).double().numpy()


def _batches(ids: Tensor, labels: Tensor, size: int) -> list[dict]:
    out = []
    for b in range(0, len(ids), size):
        i = ids[b : b + size]
        out.append(
            {"input_ids": i, "attention_mask": (i != 0).long(), "labels": labels[b : b + size]}
        )
    return out


def collect(bench: LMBench, state: dict, model_id: int, p: int, micro: int = 16) -> Collected:
    """One checkpoint's rows and curvatures at proj_dim ``p`` (float64 Grams)."""
    model = loaded(bench, state)
    c = bench.corpus()
    task = resolve_task("causal_lm")
    comp_f = HookGradientComputer(model, task)
    comp_s = HookGradientComputer(model, SampledLM(torch.Generator().manual_seed(model_id)))
    layout: ParamLayout = comp_f.layout
    proj = TokenKronecker(layout.grad_dim, p, 0, kronecker_views(model, layout))
    scale = math.sqrt(layout.grad_dim)
    secs = {"rows": 0.0, "token_f": 0.0, "sampled": 0.0, "token_s": 0.0}

    def run(comp: HookGradientComputer, batch: dict, gram: Tensor | None) -> Tensor:
        ids = batch["input_ids"]
        proj.begin(ids.shape[0], ids.shape[1])
        rows = torch.zeros(ids.shape[0], p)

        def sink(blocks: list) -> None:
            rows.add_(proj.project(blocks, model_id))

        comp.stream(batch, sink)
        if gram is not None:
            t0 = time.perf_counter()
            # float32 products per micro-batch (the hot spot), summed in float64
            phi = (proj.pos / scale).reshape(-1, p)
            e = proj.extra / scale
            gram += (phi.T @ phi + e.T @ e).double()
            return rows / scale, time.perf_counter() - t0
        return rows / scale, 0.0

    h_f = torch.zeros(p, p, dtype=torch.float64)
    h_s = torch.zeros(p, p, dtype=torch.float64)
    xs, gs = [], []
    for batch in _batches(c.train, c.train_labels(), micro):
        t0 = time.perf_counter()
        x, dt = run(comp_f, batch, h_f)
        secs["rows"] += time.perf_counter() - t0 - dt
        secs["token_f"] += dt
        t0 = time.perf_counter()
        g, dt = run(comp_s, batch, h_s)
        secs["sampled"] += time.perf_counter() - t0 - dt
        secs["token_s"] += dt
        xs.append(x)
        gs.append(g)
    ts = [run(comp_f, b, None)[0] for b in _batches(c.targets, c.target_labels, micro)]
    return Collected(
        torch.cat(xs).double().numpy(),
        torch.cat(ts).double().numpy(),
        torch.cat(gs).double().numpy(),
        h_f.numpy(),
        h_s.numpy(),
        secs,
    )
