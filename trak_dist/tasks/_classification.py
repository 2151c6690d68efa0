"""Image and text classification: the margin output and Q = 1 − p, as in traker 0.3.2."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor, nn

from trak_dist.batches import Batch
from trak_dist.errors import ConfigError
from trak_dist.tasks._base import BatchedOutput, ModelOutput, Params, margin, one_minus_p
from trak_dist.tasks._inputs import dict_labels, logits, model_inputs


def one_position(z: Tensor) -> tuple[Tensor, Tensor]:
    """A classifier's logits ``[B, C]`` as ``SampledLabels`` reads them: one counted position
    per row, ``[B, 1, C]`` and an all-true mask ``[B, 1]``."""
    return z.unsqueeze(1), torch.ones(z.shape[0], 1, dtype=torch.bool, device=z.device)


class OneLabelPerRow:
    """``SampledLabels``' width for classifiers: one uniform per row, one label drawn per
    example."""

    @staticmethod
    def sampling_width(batch: Batch) -> int:
        return 1


class ImageClassification(OneLabelPerRow, ModelOutput):
    """f = log p/(1−p) of the label's class; a sample is ``(image, label)``; ``temperature``:
    of Q's softmax."""

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

    def get_outputs_and_q(self, model: nn.Module, batch: Sequence[Tensor]) -> tuple[Tensor, Tensor]:
        """``get_outputs`` and Q ``[B]`` from the same forward pass."""
        images, labels = batch
        z = model(images)
        return margin(z, labels), one_minus_p(z.detach(), labels, self.loss_temperature)

    def get_out_to_loss_grad(
        self, model: nn.Module, weights: Params, buffers: Params, batch: Sequence[Tensor]
    ) -> Tensor:
        images, labels = batch
        logits = torch.func.functional_call(model, (weights, buffers), (images,))
        return one_minus_p(logits, labels, self.loss_temperature)

    def sampling_logits(
        self, model: nn.Module, params: tuple[Params, Params] | None, batch: Sequence[Tensor]
    ) -> tuple[Tensor, Tensor]:
        """Class logits ``[B, 1, C]`` and an all-true mask ``[B, 1]`` (``SampledLabels``)."""
        images = batch[0]
        if params is None:
            z = model(images)
        else:
            z = torch.func.functional_call(model, params, (images,))
        return one_position(z)


class TextClassification(OneLabelPerRow, BatchedOutput):
    """f = log p/(1−p) of the label's class for sequence classifiers (e.g. HF
    ``*ForSequenceClassification``), called as ``model(input_ids=, attention_mask=,
    [token_type_ids=])``; Q = 1 − p.

    A batch is ``(input_ids, token_type_ids, attention_mask, label)`` (traker's layout),
    ``(input_ids, attention_mask, label)`` (no token types: GPT-2 embeds zeros differently from
    none), or a Hugging Face dict (``input_ids``, ``attention_mask``, optional
    ``token_type_ids`` / ``position_ids``, ``labels`` or ``label``; other keys ignored).

    Args:
        temperature: softmax temperature of Q.
    """

    @staticmethod
    def _split(batch: Batch) -> tuple[dict[str, Tensor], Tensor]:
        """The model's keyword arguments and the labels ``[B]``."""
        what = "text_classification"
        if isinstance(batch, Mapping):
            labels = dict_labels(batch, what)
            if labels is None:
                raise ConfigError(
                    f"{what}: a dict batch needs 'labels' (or 'label'); got keys {sorted(batch)}."
                )
            return model_inputs(batch, what), labels
        if len(batch) == 4:
            ids, types, mask, labels = batch
            return {"input_ids": ids, "token_type_ids": types, "attention_mask": mask}, labels
        if len(batch) == 3:
            ids, mask, labels = batch
            return {"input_ids": ids, "attention_mask": mask}, labels
        raise ConfigError(
            f"{what}: a tuple batch is (input_ids, token_type_ids, attention_mask, label) or "
            f"(input_ids, attention_mask, label); got {len(batch)} tensors."
        )

    def outputs(
        self, model: nn.Module, params: tuple[Params, Params] | None, batch: Batch
    ) -> Tensor:
        inputs, labels = self._split(batch)
        return margin(logits(model, params, inputs), labels)

    def sampling_logits(
        self, model: nn.Module, params: tuple[Params, Params] | None, batch: Batch
    ) -> tuple[Tensor, Tensor]:
        """Class logits ``[B, 1, C]`` and an all-true mask ``[B, 1]`` (``SampledLabels``)."""
        inputs, _ = self._split(batch)
        return one_position(logits(model, params, inputs))

    def get_outputs_and_q(self, model: nn.Module, batch: Batch) -> tuple[Tensor, Tensor]:
        """``get_outputs`` and Q ``[B]`` from the same forward pass."""
        inputs, labels = self._split(batch)
        z = logits(model, None, inputs)
        return margin(z, labels), one_minus_p(z.detach(), labels, self.loss_temperature)

    def get_out_to_loss_grad(
        self, model: nn.Module, weights: Params, buffers: Params, batch: Batch
    ) -> Tensor:
        inputs, labels = self._split(batch)
        return one_minus_p(logits(model, (weights, buffers), inputs), labels, self.loss_temperature)


class IterativeImageClassification(ImageClassification):
    """traker's ``iterative_image_classification``: ImageClassification's margin, also in the
    calling convention of traker's ``IterativeGradientComputer`` (``get_output(model, None,
    None, images, labels)`` once per batch, a plain forward); the same features either way."""

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
