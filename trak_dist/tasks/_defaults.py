"""What ``auto`` means for a task, at every front door: the CLI's and ``trak_dist.run``'s
``JobConfig`` (``proj_dim``, ``projection.kind``, ``featurize.curvature``) and ``TRAKer``."""

from __future__ import annotations

import contextlib
import importlib
from dataclasses import dataclass
from typing import Any

from trak_dist.tasks._language import CausalLM

DEFAULT_PROJ_DIM, LM_PROJ_DIM = 512, 2048
TRAKER_PROJ_DIM = 2048  # traker 0.3.2's proj_dim, which TRAKer keeps outside causal LMs
FISHER_DRAWS = 1  # label draws per row for the sampled-label Fisher, every task


@dataclass(frozen=True)
class TaskDefaults:
    """What ``auto`` resolves to for one task.

    Attributes:
        proj_dim: p.
        projection: the projection's kind (``kronecker``, ``rademacher``).
        curvature: K's Gram: ``fisher`` (the sampled-label Fisher's GᵀG) or ``xtx``.
    """

    proj_dim: int
    projection: str
    curvature: str


def is_causal_lm(task: Any) -> bool:
    """Whether ``task`` (a name in ``TASKS``, an import path, a class or an instance) is a
    causal language model's output (``CausalLM`` or a subclass)."""
    if isinstance(task, str) and ":" in task:
        # an import path: its class decides (one that cannot be imported fails with one clear
        # line where the task is resolved, not here)
        module, _, name = task.partition(":")
        with contextlib.suppress(ImportError, AttributeError):
            task = getattr(importlib.import_module(module), name)
    if isinstance(task, str):
        return task == "causal_lm"
    return isinstance(task, CausalLM) or (isinstance(task, type) and issubclass(task, CausalLM))


def task_defaults(task: Any, traker: bool = False) -> TaskDefaults:
    """What ``auto`` means for ``task``. Causal LMs, at every door: p = 2048 with the
    Kronecker projection and the sampled-label Fisher as K (the LDS rose 12–34 % over dense
    p = 512 with XᵀX on the LM benchmarks at 1.2–2.2× its featurisation CPU,
    benchmarks/RESULTS.md "Causal LMs"). Other tasks: dense Rademacher with XᵀX, at p = 512
    for the job (``JobConfig``), or at traker's p = 2048 for ``TRAKer`` (``traker=True``), whose
    other tasks keep traker's numbers (docs/traker.md)."""
    if is_causal_lm(task):
        return TaskDefaults(LM_PROJ_DIM, "kronecker", "fisher")
    return TaskDefaults(TRAKER_PROJ_DIM if traker else DEFAULT_PROJ_DIM, "rademacher", "xtx")
