"""Causal language models: the summed next-token margin and its out-to-loss weight."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager

import torch
from torch import Tensor, nn

from trak_dist.batches import Batch
from trak_dist.errors import ConfigError, LabelError
from trak_dist.tasks._base import BatchedOutput, Params, margin, valid_labels
from trak_dist.tasks._inputs import dict_labels, logits, model_inputs

IGNORE_INDEX = -100  # Hugging Face's "no loss here" label
Q_MODES = ("one", "mean")


class CausalLM(BatchedOutput):
    """TRAK's model output for next-token prediction (e.g. Hugging Face ``GPT2LMHeadModel``).

    ``model(input_ids=, attention_mask=)`` returns logits ``[B, T, V]``. Position t predicts
    y_t = ``input_ids[t+1]`` and counts (t ∈ 𝒯) when both tokens are real and, with ``labels``,
    ``labels[t+1] != -100``. With p_t = softmax(z_t)[y_t]:

        margin_t = log p_t/(1 − p_t) = z_t[y_t] − logsumexp_{v ≠ y_t} z_t[v]
        f        = Σ_{t∈𝒯} margin_t
        Q        = 1                                  (q="one", the default)
        Q        = (1/|𝒯|) Σ_{t∈𝒯} (1 − p_t)          (q="mean"; 0 when 𝒯 is empty)

    Why Q = 1 by default: TRAK's out-to-loss weight comes from a one-output model, where
    ∇θℓ = −(1 − p) ∇θf exactly. A document is |𝒯| outputs, ∇θL = −Σ_t (1 − p_t) ∇θmargin_t,
    and one scalar per document cannot carry per-token weights. ``q="mean"`` is the scalar
    that is exact when the (1 − p_t) are equal; in a document the model has learnt in part
    they are not: the tokens it memorised have 1 − p_t ≈ 0 and the rest keep theirs, so the
    mean shrinks exactly the documents that taught the model what a target asks, whatever
    tokens the target's score came from. On the planted-fact benchmark
    (``benchmarks.planted_facts``: 40 facts, 200 documents) the stating documents' mean
    Q was 0.11 against 0.28 for the others and the stating document was the top proponent for
    23–30 % of the targets; with Q = 1, 90–100 % (benchmarks/RESULTS.md, "Planted facts").
    HF's token-mean loss only scales all scores alike.

    A batch is ``(input_ids, attention_mask[, labels])`` or a dict (``input_ids``, optional
    ``attention_mask``, ``labels``, ``token_type_ids``, ``position_ids``). Pad on the right, or
    pass ``position_ids`` with left padding.

    Args:
        temperature: softmax temperature of Q (``q="mean"``).
        q: ``"one"`` (default) or ``"mean"``: the out-to-loss weight above (on the command
            line ``+task.kwargs.q=mean``).
    """

    def __init__(self, temperature: float = 1.0, q: str = "one") -> None:
        super().__init__(temperature)
        if q not in Q_MODES:
            raise ConfigError(
                f"causal_lm: q={q!r}; expected one of {list(Q_MODES)} (task.kwargs.q): 'one' "
                "weighs every document alike, 'mean' by its mean 1 − p over counted tokens."
            )
        self.q = q

    @staticmethod
    def _split(batch: Batch) -> tuple[dict[str, Tensor], Tensor, Tensor]:
        """The model's keyword arguments, next-token targets ``[B, T-1]`` (0 where not
        counted) and the mask 𝒯 of counted positions ``[B, T-1]``."""
        what = "causal_lm"
        if isinstance(batch, Mapping):
            inputs = model_inputs(batch, what)
            labels = dict_labels(batch, what)
        elif len(batch) in (2, 3):
            inputs = {"input_ids": batch[0], "attention_mask": batch[1]}
            labels = batch[2] if len(batch) == 3 else None
        else:
            raise ConfigError(
                f"{what}: a tuple batch is (input_ids, attention_mask) or (input_ids, "
                f"attention_mask, labels); got {len(batch)} tensors."
            )
        ids = inputs["input_ids"]
        if ids.dim() != 2 or ids.shape[1] < 2:
            raise ConfigError(
                f"{what}: input_ids must be [batch, tokens] with at least 2 tokens; got shape "
                f"{tuple(ids.shape)}."
            )
        targets = ids[:, 1:] if labels is None else labels[:, 1:]
        counted = targets != IGNORE_INDEX
        mask = inputs.get("attention_mask")
        if mask is not None:
            real = mask.bool()
            counted = counted & real[:, 1:] & real[:, :-1]
        return inputs, torch.where(counted, targets, 0), counted

    def outputs(
        self, model: nn.Module, params: tuple[Params, Params] | None, batch: Batch
    ) -> Tensor:
        z, targets, counted = self._logits(model, params, batch)
        return self._summed_margin(z, targets, counted)

    def get_out_to_loss_grad(
        self, model: nn.Module, weights: Params, buffers: Params, batch: Batch
    ) -> Tensor:
        z, targets, counted = self._logits(model, (weights, buffers), batch)
        return self._q(z, targets, counted)

    def get_outputs_and_q(self, model: nn.Module, batch: Batch) -> tuple[Tensor, Tensor]:
        """``get_outputs`` and Q ``[B]`` from the same forward pass (the hook engine's entry
        when it needs Q: one forward less per micro-batch)."""
        z, targets, counted = self._logits(model, None, batch)
        return self._summed_margin(z, targets, counted), self._q(z.detach(), targets, counted)

    def sampling_logits(
        self, model: nn.Module, params: tuple[Params, Params] | None, batch: Batch
    ) -> tuple[Tensor, Tensor]:
        """Next-token logits ``[B, T-1, V]`` and the mask of counted positions ``[B, T-1]``:
        what ``SampledLabels`` draws the Fisher's labels from (``tasks/_sampled.py``)."""
        z, _, counted = self._logits(model, params, batch)
        return z, counted

    @staticmethod
    def sampling_width(batch: Batch) -> int:
        """Uniforms per row for ``SampledLabels``: one per token (the first one unused), so
        that the noise is cut with the batch's padding (``_padding.trim``)."""
        ids = batch["input_ids"] if isinstance(batch, Mapping) else batch[0]
        return int(ids.shape[1])

    def _logits(
        self, model: nn.Module, params: tuple[Params, Params] | None, batch: Batch
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Next-token logits ``[B, T-1, V]`` with ``_split``'s targets and mask."""
        inputs, targets, counted = self._split(batch)
        return logits(model, params, inputs)[:, :-1], targets, counted

    @staticmethod
    def _summed_margin(z: Tensor, targets: Tensor, counted: Tensor) -> Tensor:
        """f ``[B]``."""
        with _per_sample(targets):
            per_token = margin(z.reshape(-1, z.shape[-1]), targets.reshape(-1))
        per_token = per_token.view(targets.shape)
        # where, not a product: a position that does not count contributes exactly 0
        return torch.where(counted, per_token, 0).sum(dim=1)

    def _q(self, z: Tensor, targets: Tensor, counted: Tensor) -> Tensor:
        """Q ``[B]`` (detached)."""
        # a token id ≥ the vocabulary: a LabelError, not gather's index error
        with _per_sample(targets):
            valid_labels(z.reshape(-1, z.shape[-1]), targets.reshape(-1))
        if self.q == "one":
            return torch.ones(z.shape[0], dtype=z.dtype, device=z.device)
        probs = torch.softmax(z / self.loss_temperature, dim=-1)
        p = probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        residual = torch.where(counted, 1 - p, 0).sum(dim=1)
        return (residual / counted.sum(dim=1).clamp(min=1)).detach()


@contextmanager
def _per_sample(targets: Tensor) -> Iterator[None]:
    """A LabelError of the flattened ``[B·(T-1)]`` tokens, restated per sample of the batch."""
    try:
        yield
    except LabelError as e:
        tokens = targets.shape[1]
        raise e.at([i // tokens for i in range(targets.numel())], "batch positions") from None
