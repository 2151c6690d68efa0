"""Random projections ``Pᵀg`` of per-sample gradients, all defined by one hash: the CUDA kernel
for Rademacher on a GPU when built, the torch reference otherwise, Kronecker in torch."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch

from trak_dist.errors import ConfigError, CudaExtUnavailableError
from trak_dist.projection._base import (
    FactorBlock,
    GradBlock,
    GradInput,
    ProjectionKind,
    Projector,
    as_blocks,
)
from trak_dist.projection._cuda_lib import ENV_VAR as CUDA_LIB_ENV
from trak_dist.projection._cuda_lib import CudaLibrary, library_path
from trak_dist.projection._generate import normal_block, rademacher_block, uniform_rows
from trak_dist.projection._kron_views import ParamView, balanced_cols, spec_params
from trak_dist.projection._kronecker import KroneckerProjector
from trak_dist.projection._torch import IdentityProjector, TorchProjector

__all__ = [
    "CUDA_LIB_ENV",
    "CudaLibrary",
    "FactorBlock",
    "GradBlock",
    "GradInput",
    "IdentityProjector",
    "KroneckerProjector",
    "ParamView",
    "ProjectionKind",
    "Projector",
    "TorchProjector",
    "as_blocks",
    "balanced_cols",
    "check_backend",
    "library_path",
    "make_projector",
    "normal_block",
    "rademacher_block",
    "spec_params",
    "uniform_rows",
]

logger = logging.getLogger(__name__)
BACKENDS = ("auto", "torch", "cuda")


def check_backend(
    kind: ProjectionKind | str, backend: str, device: torch.device | str | None = None
) -> None:
    """Refuse a backend that cannot project ``kind`` on ``device`` (None: not known yet):
    ConfigError for an unknown backend, or ``cuda`` for anything but Rademacher on a GPU."""
    kind = ProjectionKind(kind)
    if backend not in BACKENDS:
        raise ConfigError(f"projector backend={backend!r}; expected one of {BACKENDS}.")
    if backend != "cuda":
        return
    if kind is not ProjectionKind.RADEMACHER:
        how = "torch matmuls on any device" if kind is ProjectionKind.KRONECKER else "in torch"
        raise ConfigError(
            f"projection kind {kind.value!r} with backend=cuda: the CUDA kernel implements the "
            f"dense Rademacher matrix only, and {kind.value!r} runs as {how}. Use backend=auto "
            "or torch (or kind=rademacher for the kernel)."
        )
    if device is not None and torch.device(device).type != "cuda":
        raise ConfigError(
            f"projection backend=cuda with device={device}: the CUDA kernel needs the gradients "
            "on a GPU. Use device=cuda (or auto on a GPU worker), or backend=auto or torch."
        )


def make_projector(
    kind: ProjectionKind | str,
    grad_dim: int,
    proj_dim: int,
    seed: int = 0,
    device: torch.device | str = "cpu",
    backend: str = "auto",
    views: Sequence[ParamView] | None = None,
) -> Projector:
    """Build the projector for ``kind`` (``rademacher``, ``normal``, ``identity``, ``kronecker``).

    Args:
        proj_dim: p (ignored for ``identity``, which keeps all d entries).
        backend: ``auto`` (the CUDA kernel for Rademacher on a GPU when available, else torch),
            ``torch``, or ``cuda`` (fail if the kernel cannot be used).
        views: the parameters' matrix views, required for ``kronecker``.
    """
    kind = ProjectionKind(kind)
    # device left out: a CPU device with backend=cuda is CudaProjector's own error below
    check_backend(kind, backend)
    if kind is ProjectionKind.IDENTITY:
        return IdentityProjector(grad_dim, None, seed)
    if kind is ProjectionKind.KRONECKER:
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
