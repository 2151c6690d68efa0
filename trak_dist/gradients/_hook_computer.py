"""The hook engine: per-sample gradients from module inputs and output gradients, one module at a
time, from ONE backward pass of the micro-batch's summed model outputs. No vmap."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn

from trak_dist.batches import Batch, batch_size, to_device
from trak_dist.errors import ConfigError
from trak_dist.gradients._computers import GradientComputer
from trak_dist.gradients._hooks import ModuleHookManager
from trak_dist.gradients._plan import hook_plan
from trak_dist.projection import FactorBlock, GradBlock

Sink = Callable[[list[GradBlock | FactorBlock]], None]

# Σ_b of the hook gradients must match autograd's batch gradient this closely (relative to the
# parameter's gradient norm); float32 reordering is ~1e-6, a missed use of a weight is O(1).
CHECK_RTOL = 1e-3


class HookGradientComputer(GradientComputer):
    """Per-sample gradients of ``task.get_outputs(model, batch)`` from module hooks.

    In eval mode sample i's output depends on sample i only, so the gradient of the summed
    outputs at module m's output is that sample's δ; rules (``_rules.py``, ``_norms.py``) turn
    inputs and δ into per-sample parameter gradients, one module call at a time. The first
    micro-batch checks they add up to autograd's summed gradient (catches a weight used outside
    its module); later ones skip the summed weight gradients.

    Raises:
        ConfigError: the task has no ``get_outputs``, or a selected parameter has no rule.
    """

    def __init__(
        self,
        model: nn.Module,
        task: Any,
        grad_wrt: Iterable[str] | None = None,
        device: torch.device | str = "cpu",
    ) -> None:
        if not callable(getattr(task, "get_outputs", None)):
            raise ConfigError(
                f"gradient_engine=hooks needs the task's batched get_outputs(model, batch) -> [B]; "
                f"{type(task).__name__} has none. Add it (see trak_dist.tasks.ModelOutput) or use "
                "gradient_engine=vmap."
            )
        super().__init__(model, task, grad_wrt, device)
        self.plan = hook_plan(self.model, self.layout)
        self._by_module = {id(h.module): h for h in self.plan}
        keep = [h.module for h in self.plan if h.rule.keeps_output]
        self.hooks = ModuleHookManager([h.module for h in self.plan], keep)
        named = dict(self.model.named_parameters())
        self._params = [named[n] for n in self.layout.names]
        self._checked = False

    def stream(self, batch: Batch, sink: Sink, with_q: bool = False) -> Tensor | None:
        """Run the micro-batch; ``sink`` gets each module call's blocks as backward reaches it
        (a reused weight's blocks come several times: its gradient is their sum). Returns Q
        ``[B]`` from the same forward with ``with_q`` and ``get_outputs_and_q``, else None."""
        batch = to_device(batch, self.device)
        size = batch_size(batch)
        check = not self._checked
        sums = torch.zeros(self.layout.grad_dim, device=self.device) if check else None

        def on_grad(
            module: nn.Module, inputs: tuple[Any, ...], out: Tensor | None, g: Tensor
        ) -> None:
            entry = self._by_module[id(module)]
            if g.shape[0] != size:
                raise ConfigError(
                    f"the output gradient of {entry.name} has shape {tuple(g.shape)}, not batch "
                    f"{size} first; the hook engine needs samples on dim 0. Use "
                    "gradient_engine=vmap."
                )
            blocks = entry.rule.blocks(module, inputs, out, g.detach(), entry.offsets)
            if sums is not None:
                _add_batch_sums(sums, blocks)
            sink(blocks)

        root = None if check else torch.zeros((), device=self.device, requires_grad=True)
        fused = getattr(self.task, "get_outputs_and_q", None) if with_q else None
        q = None
        with self._requires_grad(check), self.hooks.capture(on_grad, size, root):
            if callable(fused):
                out, q = fused(self.model, batch)
            else:
                out = self.task.get_outputs(self.model, batch)
            if not isinstance(out, Tensor) or out.numel() != size:
                shape = tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__
                raise ConfigError(
                    f"{type(self.task).__name__}.get_outputs returned {shape} for a batch of "
                    f"{size}; expected one output per sample, [B]."
                )
            total = out.sum()
            if check:
                ref = torch.autograd.grad(total, self._params, allow_unused=True)
            elif total.requires_grad and root is not None:
                torch.autograd.grad(total, [root], allow_unused=True)
        if sums is not None:
            self._verify(sums, ref)
            self._checked = True
        return None if q is None else q.detach().reshape(-1).to(torch.float32)

    @contextmanager
    def _requires_grad(self, check: bool) -> Iterator[None]:
        """Check mode: the selected parameters require grad (autograd's summed gradient is the
        reference). Fast mode: none does, so backward computes activation gradients only."""
        params = list(self.model.parameters())
        before = [p.requires_grad for p in params]
        chosen = {id(p) for p in self._params} if check else set()
        try:
            for p in params:
                p.requires_grad_(id(p) in chosen)
            with torch.enable_grad():
                yield
        finally:
            for p, flag in zip(params, before, strict=True):
                p.requires_grad_(flag)

    def _verify(self, sums: Tensor, ref: tuple[Tensor | None, ...]) -> None:
        norms = [0.0 if r is None else float(r.norm()) for r in ref]
        floor = 1e-3 * math.sqrt(sum(n * n for n in norms))
        bad = []
        for name, o, n, r, norm in zip(
            self.layout.names, self.layout.offsets, self.layout.numels, ref, norms, strict=True
        ):
            want = torch.zeros(n, device=self.device) if r is None else r.reshape(-1).float()
            err = float((sums[o : o + n] - want).norm())
            # bfloat16/float16 weights: autograd's reference is itself rounded to their precision
            rtol = CHECK_RTOL if r is None else max(CHECK_RTOL, 4 * torch.finfo(r.dtype).eps)
            if err > rtol * max(norm, floor):
                bad.append(f"{name} (relative error {err / max(norm, 1e-30):.3g})")
        if bad:
            raise ConfigError(
                "gradient_engine=hooks: the per-sample gradients from module hooks do not add up "
                f"to autograd's batch gradient for {bad[:5]}. The parameter is probably used "
                "outside its module's forward (e.g. a weight read directly by another module or "
                "in a functional op), or a module modifies its output in place. Use "
                "gradient_engine=vmap, or leave it out with grad_wrt."
            )

    def per_sample_grads(self, batch: Batch) -> dict[str, Tensor]:
        """``{name: [B, *param.shape]}`` in ``layout`` order, formed densely (tests, traker's
        API); the featurizer streams :meth:`stream` instead."""
        size = batch_size(batch)
        flat = torch.zeros(size, self.layout.grad_dim, device=self.device)

        def sink(blocks: list[GradBlock | FactorBlock]) -> None:
            for b in blocks:
                for gb in b.grad_blocks() if isinstance(b, FactorBlock) else [b]:
                    flat[:, gb.offset : gb.offset + gb.grad.shape[1]] += gb.grad

        self.stream(batch, sink)
        return {
            name: flat[:, o : o + n].reshape(size, *p.shape)
            for name, o, n, p in zip(
                self.layout.names,
                self.layout.offsets,
                self.layout.numels,
                self._params,
                strict=True,
            )
        }


def _add_batch_sums(sums: Tensor, blocks: list[GradBlock | FactorBlock]) -> None:
    """``sums[rows of each block] += Σ_b block`` (the check's side of the comparison)."""
    for b in blocks:
        if isinstance(b, FactorBlock) and not b.one_hot:
            left = b.left.reshape(-1, b.rows).float()
            total = (left.T @ b.right.reshape(-1, b.cols).float()).reshape(-1)
            sums[b.offset : b.offset + total.numel()] += total
            continue
        for gb in b.grad_blocks() if isinstance(b, FactorBlock) else [b]:
            sums[gb.offset : gb.offset + gb.grad.shape[1]] += gb.grad.sum(0).float()
