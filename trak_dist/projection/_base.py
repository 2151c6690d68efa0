"""The projector interface every backend implements."""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import NamedTuple

import torch

from trak_dist.errors import ConfigError


class ProjectionKind(str, enum.Enum):
    """How the entries of P are drawn (``docs/projection.md``)."""

    RADEMACHER = "rademacher"
    NORMAL = "normal"
    IDENTITY = "identity"
    KRONECKER = "kronecker"


class GradBlock(NamedTuple):
    """Per-sample gradients ``grad`` ``[B, n]`` of one parameter, whose column ``k`` meets row
    ``offset + k`` of P."""

    offset: int
    grad: torch.Tensor


class FactorBlock(NamedTuple):
    """Per-sample gradients of one matrix-shaped parameter, as sums of outer products.

    Sample b's gradient (the ``[rows, cols]`` view starting at global row ``offset``) is
    ``Σ_t left[b, t] ⊗ right[b, t]``; ``left`` is ``[B, T, rows]`` floats, or ``[B, T]`` int64
    row indices (one-hot rows, embeddings); ``right`` is ``[B, T, cols]``. The Kronecker
    projector projects the factors; every other projector gets :meth:`grad_blocks`."""

    offset: int
    rows: int
    left: torch.Tensor
    right: torch.Tensor

    @property
    def cols(self) -> int:
        return int(self.right.shape[-1])

    @property
    def one_hot(self) -> bool:
        return not self.left.is_floating_point()

    def dense(self) -> torch.Tensor:
        """``[B, rows·cols]``: the per-sample gradients formed."""
        batch = self.right.shape[0]
        if not self.one_hot:
            return torch.einsum("btr,btc->brc", self.left, self.right).reshape(batch, -1)
        out = self.right.new_zeros(batch * self.rows, self.cols)
        rows = torch.arange(batch, device=self.left.device)[:, None] * self.rows + self.left
        out.index_add_(0, rows.reshape(-1), self.right.reshape(-1, self.cols))
        return out.reshape(batch, -1)

    def grad_blocks(self) -> list[GradBlock]:
        """The formed gradients as :class:`GradBlock` s; for one-hot factors only the rows of the
        tokens present (an embedding's gradient is zero elsewhere), in runs of consecutive rows."""
        if not self.one_hot:
            return [GradBlock(self.offset, self.dense())]
        batch, cols = self.right.shape[0], self.cols
        ids, inverse = torch.unique(self.left, return_inverse=True)  # sorted
        n = ids.numel()
        sums = self.right.new_zeros(batch * n, cols)
        slot = torch.arange(batch, device=self.left.device)[:, None] * n + inverse
        sums.index_add_(0, slot.reshape(-1), self.right.reshape(-1, cols))
        sums = sums.reshape(batch, n, cols)
        starts = ids.tolist()
        blocks, s = [], 0
        for e in range(1, n + 1):
            if e == n or starts[e] != starts[e - 1] + 1:
                grad = sums[:, s:e].reshape(batch, -1)
                blocks.append(GradBlock(self.offset + starts[s] * cols, grad))
                s = e
        return blocks


GradInput = torch.Tensor | Sequence[GradBlock | FactorBlock] | Mapping[str, torch.Tensor]

MAX_SEED = 2**64
MAX_MODEL_ID = 2**32


def as_blocks(grads: GradInput) -> list[GradBlock]:
    """Normalise ``[B, d]``, a dict of ``[B, *shape]`` grads (laid out in iteration order:
    ``named_parameters()`` for vmap, which defines P's rows), or blocks to formed blocks."""
    if isinstance(grads, torch.Tensor):
        if grads.dim() != 2:
            raise ConfigError(
                f"projector input has shape {tuple(grads.shape)}; expected [batch, grad_dim]. "
                "Flatten per-sample gradients or pass a dict of per-parameter gradients."
            )
        return [GradBlock(0, grads)]
    if isinstance(grads, Mapping):
        blocks = []
        offset = 0
        for g in grads.values():
            flat = g.reshape(g.shape[0], -1)
            blocks.append(GradBlock(offset, flat))
            offset += flat.shape[1]
        return blocks
    blocks = []
    for b in grads:
        if isinstance(b, FactorBlock):
            blocks += b.grad_blocks()
        else:
            blocks.append(GradBlock(int(b[0]), b[1].reshape(b[1].shape[0], -1)))
    return blocks


def check_model_id(model_id: int) -> int:
    if not 0 <= int(model_id) < MAX_MODEL_ID:
        raise ConfigError(
            f"model_id={model_id} is outside [0, 2**32); the projection hash takes a 32-bit "
            "checkpoint id. Number checkpoints 0, 1, 2, …"
        )
    return int(model_id)


class Projector(ABC):
    """Computes ``Pᵀ g`` for a batch of gradients (``docs/projection.md``); the caller applies
    TRAK's 1/sqrt(d)."""

    kind: ProjectionKind

    def __init__(self, grad_dim: int, proj_dim: int, seed: int) -> None:
        if grad_dim < 1:
            raise ConfigError(f"grad_dim={grad_dim}; expected a positive number of parameters.")
        if proj_dim < 1:
            raise ConfigError(f"proj_dim={proj_dim}; expected a positive integer, e.g. 2048.")
        if not 0 <= seed < MAX_SEED:
            raise ConfigError(f"projector_seed={seed}; expected an integer in [0, 2**64).")
        self.grad_dim = int(grad_dim)
        self.proj_dim = int(proj_dim)
        self.seed = int(seed)

    @abstractmethod
    def project(self, grads: GradInput, model_id: int) -> torch.Tensor:
        """Project per-sample gradients (``[B, d]``, a ``{name: [B, *shape]}`` dict, or a list
        of :class:`GradBlock`) with checkpoint ``model_id``'s P; ``[B, proj_dim]`` float32."""

    def free_memory(self) -> None:  # noqa: B027 - optional hook, a no-op by default
        """Drop cached matrices (traker API)."""

    def _check_blocks(self, blocks: list[GradBlock]) -> None:
        for b in blocks:
            if b.offset < 0 or b.offset + b.grad.shape[1] > self.grad_dim:
                raise ConfigError(
                    f"gradient block at rows [{b.offset}, {b.offset + b.grad.shape[1]}) falls "
                    f"outside the projector's grad_dim={self.grad_dim}. The projector was built "
                    "for a different parameter set (check grad_wrt)."
                )
