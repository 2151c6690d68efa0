"""Random projections ``Pᵀg`` of per-sample gradients, all defined by one hash.

``make_projector`` picks the backend: the CUDA kernel (``cuda_ext/``) for Rademacher projections
on a GPU when its library is built, the torch reference otherwise. The Kronecker projection
(``_kronecker.py``) is torch code on any device.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch

from trak_dist.errors import ConfigError, CudaExtUnavailableError
from trak_dist.projection._base import FactorBlock, GradBlock, ProjectionKind, Projector, as_blocks
from trak_dist.projection._generate import normal_block, rademacher_block
from trak_dist.projection._kron_views import ParamView, balanced_cols, spec_params
from trak_dist.projection._kronecker import KroneckerProjector
from trak_dist.projection._torch import IdentityProjector, TorchProjector

__all__ = [
    "FactorBlock",
    "GradBlock",
    "IdentityProjector",
    "KroneckerProjector",
    "ParamView",
    "ProjectionKind",
    "Projector",
    "TorchProjector",
    "as_blocks",
    "balanced_cols",
    "make_projector",
    "normal_block",
    "rademacher_block",
    "spec_params",
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
    views: Sequence[ParamView] | None = None,
) -> Projector:
    """Build the projector for ``kind`` on ``device``.

    Args:
        kind: ``rademacher``, ``normal``, ``identity`` or ``kronecker``.
        grad_dim: d.
        proj_dim: p (ignored for ``identity``, which keeps all d entries).
        seed: projector seed.
        device: where gradients live.
        backend: ``auto`` (CUDA kernel for Rademacher on a GPU when available, else torch),
            ``torch``, or ``cuda`` (fail if the kernel cannot be used).
        views: the parameters' matrix views, required for ``kronecker``
            (``trak_dist.gradients.kronecker_views``).
    """
    kind = ProjectionKind(kind)
    if backend not in BACKENDS:
        raise ConfigError(f"projector backend={backend!r}; expected one of {BACKENDS}.")
    if kind is ProjectionKind.IDENTITY:
        return IdentityProjector(grad_dim, None, seed)
    if kind is ProjectionKind.KRONECKER:
        if backend == "cuda":
            raise ConfigError(
                "projection kind 'kronecker' runs as torch matmuls on any device; the CUDA kernel "
                "implements the dense Rademacher matrix only. Use backend=auto or torch."
            )
        if views is None:
            raise ConfigError(
                "a Kronecker projector needs the parameters' matrix views; build them with "
                "trak_dist.gradients.kronecker_views(model, layout)."
            )
        return KroneckerProjector(grad_dim, proj_dim, seed, views, device)
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
