"""Per-sample gradients of a task's model output: vectorised (torch.func) and a plain loop."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import Tensor, nn

from trak_dist.batches import Batch, batch_size, slice_batch, to_device
from trak_dist.errors import LabelError
from trak_dist.gradients._layout import ParamLayout


def _samples(batch: Batch) -> list[Any]:
    """The positional arguments a task's ``get_output`` takes after the weights: the batch's
    tensors in order, or the whole dict for a dict batch (one argument)."""
    return [batch] if isinstance(batch, Mapping) else list(batch)


class GradientComputer:
    """Per-sample gradients ``{name: [B, *shape]}`` with torch.func (``vmap(grad(f))``), the
    model in eval mode so a sample's gradient does not depend on its batch."""

    def __init__(
        self,
        model: nn.Module,
        task: Any,
        grad_wrt: Iterable[str] | None = None,
        device: torch.device | str = "cpu",
    ) -> None:
        self.device = torch.device(device)
        self.model = model.to(self.device).eval()
        self.task = task
        self.layout = ParamLayout.of(model, grad_wrt)
        self.load_model_params(model)

    def load_state_dict(self, state_dict: dict[str, Tensor]) -> None:
        """Load checkpoint weights into the model and refresh the functional parameters."""
        self.model.load_state_dict(state_dict)
        self.model.eval()
        self.load_model_params(self.model)

    def load_model_params(self, model: nn.Module) -> None:
        params = {k: v.detach() for k, v in model.named_parameters()}
        chosen = set(self.layout.names)
        self.selected = {k: params[k] for k in self.layout.names}
        self.frozen = {k: v for k, v in params.items() if k not in chosen}
        self.buffers = {k: v.detach() for k, v in model.named_buffers()}

    def _output(self, selected: dict[str, Tensor], *sample: Any) -> Tensor:
        weights = {**self.frozen, **selected}
        return self.task.get_output(self.model, weights, self.buffers, *sample)

    def per_sample_grads(self, batch: Batch) -> dict[str, Tensor]:
        """``{name: [B, *param.shape]}`` in ``layout`` order."""
        samples = _samples(to_device(batch, self.device))
        grad_fn = torch.func.grad(self._output, argnums=0)
        in_dims = (None, *([0] * len(samples)))
        grads = torch.func.vmap(grad_fn, in_dims=in_dims, randomness="different")(
            self.selected, *samples
        )
        return {k: grads[k] for k in self.layout.names}

    def out_to_loss(self, batch: Batch) -> Tensor:
        """Q for the batch, ``[B]`` float32."""
        batch = to_device(batch, self.device)
        weights = {**self.frozen, **self.selected}
        with torch.no_grad():
            q = self.task.get_out_to_loss_grad(self.model, weights, self.buffers, batch)
        return q.reshape(-1).to(torch.float32)


class IterativeGradientComputer(GradientComputer):
    """The same gradients, one ``torch.autograd.grad`` call per sample (slow: a fallback for
    models torch.func cannot trace, and the tests' reference)."""

    def per_sample_grads(self, batch: Batch) -> dict[str, Tensor]:
        batch = to_device(batch, self.device)
        leaves = {k: v.clone().requires_grad_(True) for k, v in self.selected.items()}
        rows: list[tuple[Tensor, ...]] = []
        for k in range(batch_size(batch)):
            sample = slice_batch(batch, k, k + 1)
            try:
                out = self._output(leaves, *(_squeeze0(s) for s in _samples(sample)))
            except LabelError as e:  # raised for a batch of one: it is sample k
                raise e.at([k], "batch positions") from None
            rows.append(torch.autograd.grad(out, list(leaves.values())))
        return {name: torch.stack([r[j] for r in rows]) for j, name in enumerate(self.layout.names)}


def _squeeze0(sample: Any) -> Any:
    if isinstance(sample, Mapping):
        return {k: v[0] for k, v in sample.items()}
    return sample[0]
