"""Rows of X and Q for a batch: per-sample gradients, projected, scaled by 1/sqrt(d)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor

from trak_dist.batches import Batch, batch_size, micro_batches
from trak_dist.errors import ConfigError, LabelError
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
        """``[B, p]`` float32 projected, scaled gradients (on the CPU).

        Raises:
            LabelError: a label is outside the model's classes (positions in ``batch``).
        """
        out = []
        offsets = self.computer.layout.offsets
        for start, mb in _offsets(micro_batches(batch, self.micro_batch)):
            with _in_batch(start, mb):
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
        # Q first: it sees the labels outside vmap, so a bad label is named before any
        # gradient is spent on the batch
        qs = []
        for start, mb in _offsets(micro_batches(batch, self.micro_batch)):
            with _in_batch(start, mb):
                qs.append(self.computer.out_to_loss(mb).cpu())
        q = torch.cat(qs)
        return self.project(batch, model_id), q


def _offsets(pieces: list[Batch]) -> Iterator[tuple[int, Batch]]:
    start = 0
    for mb in pieces:
        yield start, mb
        start += batch_size(mb)


@contextmanager
def _in_batch(start: int, mb: Batch) -> Iterator[None]:
    """Restate a LabelError's micro-batch positions as positions in the whole batch."""
    try:
        yield
    except LabelError as e:
        raise e.at(range(start, start + batch_size(mb)), "batch positions") from None
