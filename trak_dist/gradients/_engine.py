"""Choosing the gradient engine: ``vmap`` (torch.func), ``hooks`` (module hooks) or ``auto``.

``auto`` picks ``hooks`` when the task has a batched ``get_outputs`` and every selected
parameter has a hook rule: same features, no vmap tracing, one module's gradients at a time."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from trak_dist.errors import ConfigError
from trak_dist.gradients._computers import GradientComputer
from trak_dist.gradients._hook_computer import HookGradientComputer
from trak_dist.gradients._layout import ParamLayout
from trak_dist.gradients._plan import hook_plan, hook_problems

logger = logging.getLogger(__name__)
ENGINES = ("auto", "vmap", "hooks")


def hooks_unsupported(model: nn.Module, task: Any, grad_wrt: Iterable[str] | None) -> str | None:
    """Why the hook engine cannot run this model and task, or None if it can."""
    if not callable(getattr(task, "get_outputs", None)):
        return f"the task {type(task).__name__} has no batched get_outputs(model, batch)"
    problems = hook_problems(model, ParamLayout.of(model, grad_wrt))
    if problems:
        more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
        return "; ".join(problems[:3]) + more
    return None


def resolve_engine(
    engine: str, model: nn.Module, task: Any, grad_wrt: Iterable[str] | None = None
) -> str:
    """``vmap`` or ``hooks`` for ``engine`` (``auto`` as the module docstring says); ConfigError
    when ``hooks`` cannot run this model and task."""
    if engine not in ENGINES:
        raise ConfigError(f"gradient_engine={engine!r}; expected one of {ENGINES}.")
    if engine == "vmap":
        return engine
    if engine == "hooks":
        if not callable(getattr(task, "get_outputs", None)):
            raise ConfigError(
                f"gradient_engine=hooks needs the task's batched get_outputs(model, batch) -> [B]; "
                f"{type(task).__name__} has none. Add it (see trak_dist.tasks.ModelOutput) or "
                "use gradient_engine=vmap."
            )
        hook_plan(model, ParamLayout.of(model, grad_wrt))  # raises, naming what has no rule
        return engine
    why = hooks_unsupported(model, task, grad_wrt)
    if why is not None:
        logger.info("gradient_engine=auto uses vmap: %s", why)
        return "vmap"
    return "hooks"


def make_computer(
    model: nn.Module,
    task: Any,
    grad_wrt: Iterable[str] | None = None,
    device: torch.device | str = "cpu",
    engine: str = "auto",
) -> GradientComputer:
    """The gradient computer of ``engine`` (``auto``, ``vmap`` or ``hooks``)."""
    grad_wrt = None if grad_wrt is None else tuple(grad_wrt)
    if resolve_engine(engine, model, task, grad_wrt) == "hooks":
        return HookGradientComputer(model, task, grad_wrt, device)
    return GradientComputer(model, task, grad_wrt, device)
