"""Random projections ``Pᵀg`` of per-sample gradients, all defined by one hash.

``make_projector`` picks the backend: the CUDA kernel (``cuda_ext/``) for Rademacher projections
on a GPU when its library is built, the torch reference otherwise.
"""

from __future__ import annotations

import logging

import torch

from trak_dist.errors import ConfigError, CudaExtUnavailableError
from trak_dist.projection._base import GradBlock, ProjectionKind, Projector, as_blocks
from trak_dist.projection._generate import normal_block, rademacher_block
from trak_dist.projection._torch import IdentityProjector, TorchProjector

__all__ = [
    "GradBlock",
    "IdentityProjector",
    "ProjectionKind",
    "Projector",
    "TorchProjector",
    "as_blocks",
    "make_projector",
    "normal_block",
    "rademacher_block",
]

logger = logging.getLogger(__name__)
BACKENDS = ("auto", "torch", "cuda")


def make_projector(
    kind: ProjectionKind | str,
    grad_dim: int,
    proj_dim: int,
    seed: int = 0,
    device: torch.device | str = "cpu",
    backend: str = "auto",
) -> Projector:
    """Build the projector for ``kind`` on ``device``.

    Args:
        kind: ``rademacher``, ``normal`` or ``identity``.
        grad_dim: d.
        proj_dim: p (ignored for ``identity``, which keeps all d entries).
        seed: projector seed.
        device: where gradients live.
        backend: ``auto`` (CUDA kernel for Rademacher on a GPU when available, else torch),
            ``torch``, or ``cuda`` (fail if the kernel cannot be used).
    """
    kind = ProjectionKind(kind)
    if backend not in BACKENDS:
        raise ConfigError(f"projector backend={backend!r}; expected one of {BACKENDS}.")
    if kind is ProjectionKind.IDENTITY:
        return IdentityProjector(grad_dim, None, seed)
    device = torch.device(device)
    wants_cuda = backend == "cuda" or (
        backend == "auto" and device.type == "cuda" and kind is ProjectionKind.RADEMACHER
    )
    if wants_cuda:
        from trak_dist.projection._cuda import CudaProjector

        try:
            return CudaProjector(grad_dim, proj_dim, seed, device=device)
        except CudaExtUnavailableError as e:
            if backend == "cuda":
                raise
            logger.warning("CUDA projection kernel unavailable (%s); using the torch reference.", e)
    return TorchProjector(grad_dim, proj_dim, seed, kind=kind, device=device)
