"""Image and text classification: the margin output and Q = 1 − p, as in traker 0.3.2."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from trak_dist.tasks._base import ModelOutput, Params, margin, one_minus_p


class ImageClassification(ModelOutput):
    """f = log p/(1−p) of the label's class; a sample is ``(image, label)``.

    Args:
        temperature: softmax temperature of Q.
    """

    def __init__(self, temperature: float = 1.0) -> None:
        super().__init__()
        self.loss_temperature = temperature

    def get_output(
        self, model: nn.Module, weights: Params, buffers: Params, *sample: Tensor
    ) -> Tensor:
        image, label = sample
        logits = torch.func.functional_call(model, (weights, buffers), (image.unsqueeze(0),))
        return margin(logits, label.unsqueeze(0)).sum()

    def get_outputs(self, model: nn.Module, batch: Sequence[Tensor]) -> Tensor:
        """``[B]`` margins from a plain forward pass (the hook engine's entry)."""
        images, labels = batch
        return margin(model(images), labels)

    def get_out_to_loss_grad(
        self, model: nn.Module, weights: Params, buffers: Params, batch: Sequence[Tensor]
    ) -> Tensor:
        images, labels = batch
        logits = torch.func.functional_call(model, (weights, buffers), (images,))
        return one_minus_p(logits, labels, self.loss_temperature)


class TextClassification(ModelOutput):
    """Margin for sequence classifiers called as ``model(input_ids=, token_type_ids=,
    attention_mask=)``; a sample is ``(input_ids, token_type_ids, attention_mask, label)``."""

    def __init__(self, temperature: float = 1.0) -> None:
        super().__init__()
        self.loss_temperature = temperature

    @staticmethod
    def _logits(
        model: nn.Module, weights: Params, buffers: Params, ids: Tensor, types: Tensor, mask: Tensor
    ) -> Tensor:
        kwargs = {"input_ids": ids, "token_type_ids": types, "attention_mask": mask}
        out = torch.func.functional_call(model, (weights, buffers), args=(), kwargs=kwargs)
        # Hugging Face models return an object with .logits; plain modules return the tensor.
        return out.logits if hasattr(out, "logits") else out

    def get_output(
        self, model: nn.Module, weights: Params, buffers: Params, *sample: Tensor
    ) -> Tensor:
        ids, types, mask, label = sample
        logits = self._logits(
            model, weights, buffers, ids.unsqueeze(0), types.unsqueeze(0), mask.unsqueeze(0)
        )
        return margin(logits, label.unsqueeze(0)).sum()

    def get_outputs(self, model: nn.Module, batch: Sequence[Tensor]) -> Tensor:
        """``[B]`` margins from a plain forward pass (the hook engine's entry)."""
        ids, types, mask, labels = batch
        out = model(input_ids=ids, token_type_ids=types, attention_mask=mask)
        return margin(out.logits if hasattr(out, "logits") else out, labels)

    def get_out_to_loss_grad(
        self, model: nn.Module, weights: Params, buffers: Params, batch: Sequence[Tensor]
    ) -> Tensor:
        ids, types, mask, labels = batch
        logits = self._logits(model, weights, buffers, ids, types, mask)
        return one_minus_p(logits, labels, self.loss_temperature)


class IterativeImageClassification(ImageClassification):
    """traker's ``iterative_image_classification``: the margin of ImageClassification, also in
    the calling convention of traker's ``IterativeGradientComputer``.

    That computer calls ``get_output(model, None, None, images, labels)`` once per batch, with a
    plain forward pass through the model's own parameters, and differentiates each sample's
    output with autograd. Our engines call it per sample with functional weights. Both give the
    same margins, hence the same features, so this task works with every gradient computer.
    """

    def get_output(
        self, model: nn.Module, weights: Params | None, buffers: Params | None, *sample: Tensor
    ) -> Tensor:
        if weights is None:  # traker's IterativeGradientComputer: a whole batch, ``[B]``
            images, labels = sample
            return margin(model(images), labels)
        return super().get_output(model, weights, buffers or {}, *sample)

    def get_out_to_loss_grad(
        self,
        model: nn.Module,
        weights: Params | None,
        buffers: Params | None,
        batch: Sequence[Tensor],
    ) -> Tensor:
        if weights is None:
            images, labels = batch
            return one_minus_p(model(images), labels, self.loss_temperature)
        return super().get_out_to_loss_grad(model, weights, buffers or {}, batch)
