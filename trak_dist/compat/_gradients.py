"""traker gradient computer classes (``AbstractGradientComputer``) behind our interface."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import Tensor, nn

from trak_dist.batches import Batch, to_device
from trak_dist.errors import ConfigError
from trak_dist.gradients import GradientComputer, ParamLayout
from trak_dist.tasks import IterativeImageClassification, ModelOutput

# traker tasks whose get_output needs functional weights, so cannot serve its iterative computer
_FUNCTIONAL_TRAKER_TASKS = (
    "ImageClassificationModelOutput",
    "TextClassificationModelOutput",
    "CLIPModelOutput",
)


class TrakerGradients:
    """A traker gradient computer, constructed and called as traker's TRAKer does:
    ``cls(model=, task=, grad_dim=, dtype=, device=, grad_wrt=)``, ``load_model_params`` per
    checkpoint, ``compute_per_sample_grad`` (to the projector as it is) and
    ``compute_loss_grad`` (Q)."""

    def __init__(
        self,
        cls: type,
        model: nn.Module,
        task: Any,
        grad_wrt: Iterable[str] | None,
        dtype: torch.dtype,
        device: str | torch.device,
    ) -> None:
        self.model = model
        self.device = torch.device(device)
        self.layout = ParamLayout.of(model, grad_wrt)
        self.inner = cls(
            model=model,
            task=task,
            grad_dim=self.layout.grad_dim,
            dtype=dtype,
            device=device,
            grad_wrt=None if grad_wrt is None else list(grad_wrt),
        )

    def load_state_dict(self, state_dict: Mapping[str, Tensor]) -> None:
        self.model.load_state_dict(state_dict)
        self.model.eval()
        self.inner.load_model_params(self.model)

    def per_sample_grads(self, batch: Batch) -> Tensor | dict[str, Tensor]:
        """Whatever the traker computer returns: ``{name: [B, *shape]}`` or ``[B, d]``."""
        grads: Tensor | dict[str, Tensor] = self.inner.compute_per_sample_grad(
            batch=to_device(batch, self.device)
        )
        return grads

    def out_to_loss(self, batch: Batch) -> Tensor:
        """Q, ``[B]`` float32."""
        q: Tensor = self.inner.compute_loss_grad(to_device(batch, self.device))
        return q.detach().reshape(-1).to(torch.float32)


def adapt_gradient_computer(
    gradient_computer: Any,
    model: nn.Module,
    task: Any,
    grad_wrt: tuple[str, ...] | None,
    device: str | torch.device,
    dtype: torch.dtype,
) -> GradientComputer | TrakerGradients:
    """Ours (``trak_dist.gradients.GradientComputer`` subclasses) or a traker class, adapted."""
    if isinstance(gradient_computer, type) and issubclass(gradient_computer, GradientComputer):
        return gradient_computer(model, task, grad_wrt, device)
    if not (
        isinstance(gradient_computer, type)
        and hasattr(gradient_computer, "compute_per_sample_grad")
        and hasattr(gradient_computer, "compute_loss_grad")
    ):
        raise ConfigError(
            f"gradient_computer={gradient_computer!r} is neither a subclass of "
            "trak_dist.gradients.GradientComputer nor a traker AbstractGradientComputer class "
            "(with compute_per_sample_grad and compute_loss_grad). Pass the class, not an instance."
        )
    if gradient_computer.__name__ == "IterativeGradientComputer":
        _check_iterative(task, grad_wrt)
    return TrakerGradients(gradient_computer, model, task, grad_wrt, dtype, device)


def _check_iterative(task: Any, grad_wrt: tuple[str, ...] | None) -> None:
    """traker's IterativeGradientComputer calls ``get_output(model, None, None, *batch)`` on a
    whole batch and differentiates all parameters; refuse the combinations that cannot work."""
    name = type(task).__name__
    functional = (
        isinstance(task, ModelOutput) and not isinstance(task, IterativeImageClassification)
    ) or name in _FUNCTIONAL_TRAKER_TASKS
    if functional:
        raise ConfigError(
            f"traker's IterativeGradientComputer calls the task's get_output with the whole batch "
            f"and no functional weights; task {name} needs them. Use "
            "task='iterative_image_classification', or keep this task with "
            "trak_dist.gradients.IterativeGradientComputer (an autograd loop for every task)."
        )
    if grad_wrt is not None:
        raise ConfigError(
            f"traker's IterativeGradientComputer differentiates every parameter (it ignores "
            f"grad_wrt={list(grad_wrt)}). Leave grad_wrt=None, or use "
            "trak_dist.gradients.IterativeGradientComputer, which honours it."
        )
