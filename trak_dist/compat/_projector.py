"""traker projectors (``AbstractProjector``) behind our Projector interface."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from trak_dist.errors import ConfigError
from trak_dist.gradients import ParamLayout, kronecker_views
from trak_dist.projection import (
    GradInput,
    IdentityProjector,
    ProjectionKind,
    Projector,
    as_blocks,
    make_projector,
)


class TrakerProjector(Projector):
    """A traker projector (``BasicProjector``, ``CudaProjector``, a subclass), called as traker
    calls it: ``project(grads, model_id)`` with the gradient computer's output as it is."""

    kind = ProjectionKind.RADEMACHER  # not used: the store records ``projection_name``

    def __init__(self, inner: Any, grad_dim: int) -> None:
        seed = int(getattr(inner, "seed", 0))
        super().__init__(grad_dim, int(inner.proj_dim), seed if seed >= 0 else 0)
        self.inner = inner
        stated = getattr(inner, "grad_dim", None)
        if isinstance(stated, int) and stated not in (0, grad_dim):
            raise ConfigError(
                f"the projector {type(inner).__name__} was built for grad_dim={stated}; the "
                f"model's selected parameters have {grad_dim} entries (check grad_wrt)."
            )

    def project(self, grads: GradInput, model_id: int) -> torch.Tensor:
        if not isinstance(grads, (torch.Tensor, Mapping)):  # our GradBlocks: flatten as traker
            blocks = as_blocks(grads)
            first = blocks[0].grad
            flat = torch.zeros(
                first.shape[0], self.grad_dim, dtype=first.dtype, device=first.device
            )
            for offset, g in blocks:
                flat[:, offset : offset + g.shape[1]] = g
            grads = flat
        out: torch.Tensor = self.inner.project(grads, model_id=model_id)
        return out

    def free_memory(self) -> None:
        self.inner.free_memory()


def adapt_projector(projector: Any, grad_dim: int) -> Projector | None:
    """Our projector as it is; traker's NoOpProjector (``proj_dim == 0``) as our identity; any
    other object with ``project`` and ``proj_dim`` wrapped; None stays None."""
    if projector is None or isinstance(projector, Projector):
        return projector
    if not (hasattr(projector, "project") and hasattr(projector, "proj_dim")):
        raise ConfigError(
            f"projector={projector!r} has no project(grads, model_id) and proj_dim; pass a "
            "trak_dist.projection.Projector or a traker AbstractProjector."
        )
    if projector.proj_dim == 0:  # traker's NoOpProjector: exactly the identity
        return IdentityProjector(grad_dim)
    return TrakerProjector(projector, grad_dim)


def projection_name(projector: Projector) -> str:
    """What the store records as the projection: ours by kind; a traker one by class and type."""
    if isinstance(projector, TrakerProjector):
        cls = type(projector.inner)
        proj_type = getattr(projector.inner, "proj_type", "")
        proj_type = getattr(proj_type, "value", proj_type)
        return f"traker:{cls.__module__}:{cls.__qualname__}:{proj_type}"
    return ProjectionKind(projector.kind).value


def own_projector(
    model: nn.Module,
    layout: ParamLayout,
    projection: str,
    proj_dim: int,
    seed: int,
    device: torch.device,
) -> Projector:
    """Our projector of kind ``projection`` (the Kronecker one reads the layers' shapes)."""
    views = None
    if ProjectionKind(projection) is ProjectionKind.KRONECKER:
        views = kronecker_views(model, layout)
    return make_projector(projection, layout.grad_dim, proj_dim, seed, device, views=views)
