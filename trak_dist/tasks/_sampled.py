"""The sampled-label Fisher's rows: the log-likelihood of labels drawn from the model itself.

TRAK's curvature is K = XᵀX over the rows x_i of the model output f. ``featurize.curvature=
fisher`` replaces it with K = GᵀG, where g_i = Pᵀ∇θ Σ_k log p(ŷ_ik) / sqrt(d) and ŷ_ik is drawn
from the model's own predictive distribution at every counted position k of example i (every
next token of a document; the one class of a classifier). E[g gᵀ] over the draws is the Fisher
information of the example, the curvature EK-FAC and KFAC fit (with labels sampled the same
way), and unlike XᵀX it does not depend on which tokens the data happen to hold: on causal LMs
it raised the LDS at every p and made λ auto the best λ (benchmarks/RESULTS.md, "Causal LMs").

The draws are split-independent (docs/design.md, invariant 2): row r's uniforms come from a
counter-based hash of (seed, model_id, r, position) (``projection.uniform_rows``), carried in
the batch beside the inputs (key ``SAMPLING_KEY`` of a dict batch, the last tensor of a tuple
batch) so that reordering, micro-batching and trimming the padding move them with their row.
A label is the inverse CDF of the softmax at its uniform; only a uniform within float rounding
of a CDF step could draw differently in another batch composition.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

from trak_dist.batches import Batch
from trak_dist.errors import ConfigError
from trak_dist.tasks._base import BatchedOutput, Params
from trak_dist.tasks._defaults import task_defaults

SAMPLING_KEY = "trak_dist_sampling_uniforms"
CURVATURES = ("auto", "xtx", "fisher")


def supports_sampling(task: Any) -> bool:
    """Whether ``task`` gives the logits its labels are drawn from (``sampling_logits``)."""
    return callable(getattr(task, "sampling_logits", None)) and callable(
        getattr(task, "sampling_width", None)
    )


def resolve_curvature(curvature: str, task: Any) -> str:
    """``xtx`` or ``fisher`` for ``featurize.curvature`` (``auto``: ``task_defaults``, i.e.
    ``fisher`` for causal language models, where it was measured to win, ``xtx`` otherwise);
    ConfigError for an unknown value or ``fisher`` with a task that cannot draw labels."""
    if curvature not in CURVATURES:
        raise ConfigError(
            f"featurize.curvature={curvature!r}; expected one of {list(CURVATURES)}: xtx is "
            "TRAK's XᵀX, fisher the sampled-label Fisher GᵀG, auto picks per task."
        )
    if curvature == "auto":
        return task_defaults(task).curvature
    if curvature == "fisher" and not supports_sampling(task):
        raise ConfigError(
            f"featurize.curvature=fisher: the task {type(task).__name__} cannot draw labels "
            "from the model (it has no sampling_logits / sampling_width; the built-in "
            "causal_lm, image_classification and text_classification tasks have them). Use "
            "featurize.curvature=xtx."
        )
    return curvature


def attach_uniforms(batch: Batch, uniforms: Tensor) -> Batch:
    """``batch`` with the ``[B, width]`` uniforms added (a dict key, or a tuple's last tensor)."""
    if isinstance(batch, Mapping):
        if SAMPLING_KEY in batch:
            raise ConfigError(f"a batch may not use the key {SAMPLING_KEY!r} (trak_dist's own).")
        return {**batch, SAMPLING_KEY: uniforms.to(next(iter(batch.values())).device)}
    return [*batch, uniforms.to(batch[0].device)]


def _detach_uniforms(batch: Batch) -> tuple[Batch, Tensor]:
    if isinstance(batch, Mapping):
        rest = {k: v for k, v in batch.items() if k != SAMPLING_KEY}
        return rest, batch[SAMPLING_KEY]
    return list(batch[:-1]), batch[-1]


def draw_labels(z: Tensor, uniforms: Tensor) -> Tensor:
    """``[B, K]`` labels drawn from softmax(z) ``[B, K, V]`` by the inverse CDF at ``uniforms``
    ``[B, K]`` (detached: a draw carries no gradient)."""
    probs = torch.softmax(z.detach().float(), dim=-1)
    cdf = probs.cumsum(dim=-1)
    # scaled by the last entry, which rounding leaves a little off 1
    below = cdf < (uniforms.unsqueeze(-1) * cdf[..., -1:])
    return below.sum(dim=-1).clamp(max=z.shape[-1] - 1)


class SampledLabels(BatchedOutput):
    """f = Σ_k log p(ŷ_k) over ``base``'s counted positions, ŷ drawn from the model with the
    batch's uniforms (module docstring). Runs under vmap and the hook engine alike.

    Args:
        base: a task with ``sampling_logits(model, params, batch) -> ([B, K, V], [B, K])`` and
            ``sampling_width(batch) -> int`` (uniforms per row; the last K are used).
    """

    def __init__(self, base: Any) -> None:
        super().__init__()
        if not supports_sampling(base):
            resolve_curvature("fisher", base)  # raises its ConfigError
        self.base = base

    def width(self, batch: Batch) -> int:
        return int(self.base.sampling_width(batch))

    def outputs(self, model: nn.Module, params: tuple[Params, Params] | None, batch: Any) -> Tensor:
        inner, uniforms = _detach_uniforms(batch)
        z, counted = self.base.sampling_logits(model, params, inner)
        k = z.shape[1]
        labels = draw_labels(z, uniforms[:, uniforms.shape[1] - k :])
        logp = torch.log_softmax(z.float(), dim=-1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
        # where, not a product: a position that does not count contributes exactly 0
        return torch.where(counted, logp, 0).sum(dim=1)

    def get_out_to_loss_grad(
        self, model: nn.Module, weights: Params, buffers: Params, batch: Any
    ) -> Tensor:
        raise ConfigError(
            "SampledLabels gives the Fisher's rows G only; Q comes from the task's own output."
        )
