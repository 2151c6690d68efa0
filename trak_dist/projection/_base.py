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


class GradBlock(NamedTuple):
    """Per-sample gradients of one parameter, placed at its rows of the flat gradient.

    Attributes:
        offset: global row of the block's first entry in the flattened gradient.
        grad: ``[B, n]`` gradients (any float dtype); row ``offset + k`` of P meets column ``k``.
    """

    offset: int
    grad: torch.Tensor


GradInput = torch.Tensor | Sequence[GradBlock] | Mapping[str, torch.Tensor]

MAX_SEED = 2**64
MAX_MODEL_ID = 2**32


def as_blocks(grads: GradInput) -> list[GradBlock]:
    """Normalise ``[B, d]``, a dict of per-parameter ``[B, *shape]`` grads, or blocks to blocks.

    A dict is laid out in its iteration order, which for vmap output is ``named_parameters()``
    order: the layout that defines the rows of P.
    """
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
    return [GradBlock(int(o), g.reshape(g.shape[0], -1)) for o, g in grads]


def check_model_id(model_id: int) -> int:
    if not 0 <= int(model_id) < MAX_MODEL_ID:
        raise ConfigError(
            f"model_id={model_id} is outside [0, 2**32); the projection hash takes a 32-bit "
            "checkpoint id. Number checkpoints 0, 1, 2, …"
        )
    return int(model_id)


class Projector(ABC):
    """Computes ``Pᵀ g`` for a batch of gradients, ``P`` defined by ``docs/projection.md``.

    The 1/sqrt(d) scaling of TRAK is applied by the caller, not here.
    """

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
        """Project per-sample gradients.

        Args:
            grads: ``[B, d]``, a ``{name: [B, *shape]}`` dict, or a list of :class:`GradBlock`.
            model_id: the checkpoint's id; each checkpoint has its own P.

        Returns:
            ``[B, proj_dim]`` float32 on the gradients' device.
        """

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
