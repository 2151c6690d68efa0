"""traker's featurize step, for gradient computers and projectors that speak traker's formats."""

from __future__ import annotations

import torch
from torch import Tensor

from trak_dist.batches import Batch, micro_batches
from trak_dist.compat._gradients import TrakerGradients
from trak_dist.compat._projector import TrakerProjector
from trak_dist.errors import ConfigError
from trak_dist.featurize import Featurizer, normalize_factor
from trak_dist.gradients import GradientComputer
from trak_dist.projection import Projector
from trak_dist.tasks import SampledLabels


class DirectFeaturizer:
    """Rows of X and Q the way traker 0.3.2 makes them: gradients go to the projector as the
    computer returns them (dict or ``[B, d]``), the projection divided by sqrt(d) in the
    projector's output dtype. Used whenever one side is a traker class; micro-batched like
    Featurizer (``micro_batch``: None for the whole batch)."""

    def __init__(
        self,
        computer: GradientComputer | TrakerGradients,
        projector: Projector,
        micro_batch: int | None = None,
    ) -> None:
        self.computer = computer
        self.projector = projector
        self.micro_batch = micro_batch
        self.normalize_factor = normalize_factor(computer.layout.grad_dim, projector, micro_batch)

    def project(self, batch: Batch, model_id: int) -> Tensor:
        """``[B, p]`` float32 projected, scaled gradients (on the CPU)."""
        out = []
        for mb in micro_batches(batch, self.micro_batch):
            x = self.projector.project(self.computer.per_sample_grads(mb), model_id)
            # traker divides in place, so in the projector's dtype (float16 for some projectors)
            x = x / self.normalize_factor.to(x.device)
            out.append(x.to(torch.float32).cpu())
        return torch.cat(out)

    def featurize(self, batch: Batch, model_id: int) -> tuple[Tensor, Tensor]:
        """``([B, p], [B])``: projected gradients and out-to-loss weights Q (float32, CPU)."""
        x = self.project(batch, model_id)
        pieces = micro_batches(batch, self.micro_batch)
        q = torch.cat([self.computer.out_to_loss(mb).cpu() for mb in pieces])
        return x, q


def traker_classes(computer: GradientComputer | TrakerGradients, projector: Projector) -> bool:
    """Whether a traker class is on either side (then traker's featurize step runs)."""
    return not isinstance(computer, GradientComputer) or isinstance(projector, TrakerProjector)


def make_featurizer(
    computer: GradientComputer | TrakerGradients,
    projector: Projector,
    micro_batch: int | None,
    sampled: SampledLabels | None = None,
) -> Featurizer | DirectFeaturizer:
    """Our Featurizer (the fast path; with ``sampled`` it also gives the sampled-label Fisher's
    rows) unless a traker class is on either side."""
    if isinstance(computer, GradientComputer) and not isinstance(projector, TrakerProjector):
        return Featurizer(computer, projector, micro_batch, sampled)
    if sampled is not None:
        raise ConfigError(
            "curvature='fisher' needs trak_dist's own gradient computer and projector (traker's "
            "classes give no sampled-label Fisher rows); drop gradient_computer= / projector=, "
            "or pass curvature='xtx'."
        )
    return DirectFeaturizer(computer, projector, micro_batch)
