"""Forward hooks that keep each hooked module's inputs and hand them, with the gradient of its
output, to a callback during the backward pass; they exist only while a pass runs."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

from trak_dist.errors import ConfigError

OnGrad = Callable[[nn.Module, tuple[Any, ...], Tensor | None, Tensor], None]


class ModuleHookManager:
    """One forward hook per module, registered only for the length of a :meth:`capture`.

    Each hooked call hooks its output tensor; when backward reaches it, ``on_grad(module,
    inputs, output, δ)`` runs and the saved inputs are released. ``capture`` removes the hooks
    however the pass ends (docs/design.md, invariant 9).

    Args:
        modules: the modules to hook.
        keep_output: modules whose rule also reads their output.
    """

    def __init__(self, modules: Sequence[nn.Module], keep_output: Sequence[nn.Module] = ()) -> None:
        self._modules = list(modules)
        self._keep = {id(m) for m in keep_output}
        self._on_grad: OnGrad | None = None
        self._root: Tensor | None = None
        self._batch = 0

    @contextmanager
    def capture(self, on_grad: OnGrad, batch: int, root: Tensor | None = None) -> Iterator[None]:
        """Hooks active for one forward/backward pass over ``batch`` samples, removed after;
        ``root`` (a zero scalar requiring grad) is added to hooked outputs that do not require
        grad, so δ is computed even when no weight does. Captures do not nest."""
        if self._on_grad is not None:
            raise RuntimeError("ModuleHookManager.capture is already active; captures do not nest")
        handles: list[RemovableHandle] = []
        self._on_grad, self._root, self._batch = on_grad, root, batch
        try:
            for m in self._modules:  # one by one: a registration that fails leaves none behind
                handles.append(m.register_forward_hook(self._forward))
            yield
        finally:
            for h in handles:
                h.remove()
            self._on_grad = self._root = None

    def _forward(self, module: nn.Module, inputs: tuple[Any, ...], output: Any) -> Any:
        on_grad = self._on_grad
        if on_grad is None or not torch.is_grad_enabled():
            return None
        if not isinstance(output, Tensor):
            raise ConfigError(
                f"a hooked {type(module).__name__} returned {type(output).__name__}, not a "
                "tensor; use gradient_engine=vmap for this model."
            )
        replaced = None
        if output.dim() and output.shape[0] == 1 < self._batch:
            # computed once for the whole batch and broadcast later (position embeddings of
            # position_ids [1, T]): expanded here, each sample's δ reaches the hook
            output = replaced = output.expand(self._batch, *output.shape[1:])
            inputs = tuple(_expand(x, self._batch) for x in inputs)
        if not output.requires_grad and self._root is not None:
            output = replaced = output + self._root
        if not output.requires_grad:
            return None  # no gradient flows through this call
        saved: list[Any] = [
            tuple(x.detach() if isinstance(x, Tensor) else x for x in inputs),
            output.detach() if id(module) in self._keep else None,
        ]

        def hook(grad: Tensor) -> None:
            args, out = saved
            saved[:] = [(), None]  # free the inputs as soon as this module is done
            on_grad(module, args, out, grad)

        output.register_hook(hook)
        return replaced


def _expand(x: Any, batch: int) -> Any:
    if isinstance(x, Tensor) and x.dim() and x.shape[0] == 1:
        return x.expand(batch, *x.shape[1:])
    return x
