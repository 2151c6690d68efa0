"""Rows of X and Q for a batch: per-sample gradients, projected, scaled by 1/sqrt(d)."""

from __future__ import annotations

import torch
from torch import Tensor

from trak_dist.batches import Batch, micro_batches
from trak_dist.errors import ConfigError
from trak_dist.gradients import GradientComputer
from trak_dist.projection import GradBlock, Projector


class Featurizer:
    """Turns batches into projected gradients, ``micro_batch`` samples at a time.

    Peak memory is one micro-batch of per-sample gradients (``micro_batch × d`` floats) plus
    the projector's working set, whatever the batch size (invariant 5).

    Args:
        computer: per-sample gradients of the task's model output.
        projector: P (its ``grad_dim`` must equal the computer's).
        micro_batch: samples per vmap call; None for the whole batch at once.
    """

    def __init__(
        self, computer: GradientComputer, projector: Projector, micro_batch: int | None = None
    ) -> None:
        d = computer.layout.grad_dim
        if projector.grad_dim != d:
            raise ConfigError(
                f"the projector was built for grad_dim={projector.grad_dim}, the model's "
                f"selected parameters have {d} entries; build both from the same grad_wrt."
            )
        if micro_batch is not None and micro_batch < 1:
            raise ConfigError(f"micro_batch={micro_batch}; expected a positive integer or None.")
        self.computer = computer
        self.projector = projector
        self.micro_batch = micro_batch
        # traker 0.3.2 divides by sqrt(d) computed in float32; so do we, for identical numbers.
        self.normalize_factor = torch.sqrt(torch.tensor(d, dtype=torch.float32))

    def project(self, batch: Batch, model_id: int) -> Tensor:
        """``[B, p]`` float32 projected, scaled gradients (on the CPU)."""
        out = []
        offsets = self.computer.layout.offsets
        for mb in micro_batches(batch, self.micro_batch):
            grads = self.computer.per_sample_grads(mb)
            blocks = [
                GradBlock(o, g.reshape(g.shape[0], -1))
                for o, g in zip(offsets, grads.values(), strict=True)
            ]
            x = self.projector.project(blocks, model_id)
            out.append((x / self.normalize_factor.to(x.device)).cpu())
            del grads, blocks
        return torch.cat(out)

    def featurize(self, batch: Batch, model_id: int) -> tuple[Tensor, Tensor]:
        """``([B, p], [B])``: projected gradients and out-to-loss weights Q (float32, CPU)."""
        x = self.project(batch, model_id)
        pieces = micro_batches(batch, self.micro_batch)
        q = torch.cat([self.computer.out_to_loss(mb).cpu() for mb in pieces])
        return x, q
