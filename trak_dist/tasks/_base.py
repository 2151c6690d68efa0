"""The model-output protocol: what a task must provide (traker's AbstractModelOutput shape)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from trak_dist.errors import LabelError

Params = dict[str, Tensor]


class ModelOutput(ABC):
    """A model output function f(z; θ) and its out-to-loss weight Q (TRAK paper, §3).

    Subclass this (or traker's ``AbstractModelOutput``: same signatures, so traker tasks work
    unchanged) and implement:

    - ``get_output(model, weights, buffers, *sample)``: scalar f for ONE example, written with
      ``torch.func.functional_call(model, (weights, buffers), …)`` (differentiated under vmap);
      for a dict batch, the sample's dict comes after ``buffers``.
    - ``get_out_to_loss_grad(model, weights, buffers, batch)``: Q ``[B]`` or ``[B, 1]``.

    Optionally, for the module-hook engine (no vmap):

    - ``get_outputs(model, batch)``: f ``[B]`` from a plain call of ``model``; sample i's output
      must depend on sample i only (eval mode).
    - ``get_outputs_and_q(model, batch)``: ``(f, Q)`` from that one forward, Q detached and equal
      to ``get_out_to_loss_grad``'s (saves a second forward over a vocabulary's logits).

    ``BatchedOutput`` derives both output entries from one batched ``outputs`` method.

    Example:
        >>> import torch
        >>> from trak_dist.tasks import ModelOutput
        >>> class Regression(ModelOutput):
        ...     def get_output(self, model, weights, buffers, x, y):
        ...         pred = torch.func.functional_call(model, (weights, buffers), x.unsqueeze(0))
        ...         return pred.sum()
        ...     def get_out_to_loss_grad(self, model, weights, buffers, batch):
        ...         x, y = batch
        ...         return torch.ones(x.shape[0])
        >>> Regression().get_out_to_loss_grad(None, None, None, (torch.zeros(3, 2), None)).shape
        torch.Size([3])
    """

    def __init__(self) -> None:  # noqa: B027 - subclasses may take options
        pass

    @abstractmethod
    def get_output(
        self, model: nn.Module, weights: Params, buffers: Params, *sample: Tensor
    ) -> Tensor: ...

    @abstractmethod
    def get_out_to_loss_grad(
        self, model: nn.Module, weights: Params, buffers: Params, batch: Sequence[Tensor]
    ) -> Tensor: ...


class BatchedOutput(ModelOutput):
    """A task written once, for a batch: subclasses implement ``outputs(model, params, batch)
    -> [B]``; the vmap entry runs it on a batch of one with ``functional_call`` parameters, the
    hook engine's on the whole batch with the model's own. ``temperature``: of Q's softmax."""

    def __init__(self, temperature: float = 1.0) -> None:
        super().__init__()
        self.loss_temperature = temperature

    @abstractmethod
    def outputs(self, model: nn.Module, params: tuple[Params, Params] | None, batch: Any) -> Tensor:
        """``[B]`` outputs; ``params`` is ``(weights, buffers)`` for ``functional_call``, or None
        to call the model with its own parameters."""

    def get_output(
        self, model: nn.Module, weights: Params, buffers: Params, *sample: Any
    ) -> Tensor:
        if len(sample) == 1 and isinstance(sample[0], Mapping):
            batch: Any = {k: v.unsqueeze(0) for k, v in sample[0].items()}
        else:
            batch = [t.unsqueeze(0) for t in sample]
        return self.outputs(model, (weights, buffers), batch).sum()

    def get_outputs(self, model: nn.Module, batch: Any) -> Tensor:
        """``[B]`` outputs from a plain forward pass (the hook engine's entry)."""
        return self.outputs(model, None, batch)


def valid_labels(logits: Tensor, labels: Tensor) -> Tensor:
    """``[B]`` bool: which labels are one of the ``C`` classes of ``logits`` ``[B, C]``.
    LabelError for one outside ``[0, C)`` when values can be read; under vmap the caller
    poisons those outputs with NaN instead, which the store refuses to commit."""
    classes = int(logits.shape[-1])
    valid = (labels >= 0) & (labels < classes)
    try:
        ok = bool(valid.all())
    except RuntimeError:  # inside vmap: the labels are batched, their values unreadable
        return valid
    if not ok:
        bad = (~valid).nonzero().reshape(-1)
        raise LabelError(labels[bad].tolist(), bad.tolist(), classes)
    return valid


def margin(logits: Tensor, labels: Tensor) -> Tensor:
    """``[B]`` log p/(1−p) of the correct class: its logit minus logsumexp of the others
    (``labels`` outside ``[0, C)``: LabelError, or NaN outputs under vmap)."""
    valid = valid_labels(logits, labels)
    # a label of −1 would otherwise silently index the last class
    safe = torch.where(valid, labels, torch.zeros_like(labels))
    rows = torch.arange(logits.shape[0], device=logits.device)
    correct = logits[rows, safe]
    others = logits.clone()
    others[rows, safe] = torch.tensor(-torch.inf, device=logits.device, dtype=logits.dtype)
    out = correct - others.logsumexp(dim=-1)
    # ×1 is exact for valid samples; ×NaN makes an invalid one's output and gradient NaN
    poison = torch.where(valid, torch.ones_like(out), torch.full_like(out, torch.nan))
    return out * poison


def one_minus_p(logits: Tensor, labels: Tensor, temperature: float) -> Tensor:
    """Q = 1 − softmax(logits / T)[label], shape ``[B]`` (labels checked as in ``margin``)."""
    valid = valid_labels(logits, labels)
    safe = torch.where(valid, labels, torch.zeros_like(labels))
    probs = torch.softmax(logits / temperature, dim=-1)
    q = 1 - probs[torch.arange(logits.shape[0], device=logits.device), safe]
    return torch.where(valid, q, torch.full_like(q, torch.nan)).detach()


def describe(task: Any) -> str:
    """A stable name for the store's metadata."""
    cls = type(task)
    return f"{cls.__module__}:{cls.__qualname__}"
