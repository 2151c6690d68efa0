"""What ``proj_dim=auto`` and ``projection.kind=auto`` mean for a task (``JobConfig``)."""

from __future__ import annotations

import contextlib
import importlib
from typing import Any

from trak_dist.tasks._language import CausalLM

DEFAULT_PROJ_DIM, LM_PROJ_DIM = 512, 2048


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


def task_defaults(task: Any) -> tuple[int, str]:
    """``(proj_dim, projection.kind)`` that ``auto`` means for ``task``: p = 2048 with the
    Kronecker projection for causal LMs (with their default ``featurize.curvature``, the
    sampled-label Fisher: the LDS rose 12–34 % over dense p = 512 on the LM benchmarks at
    1.2–2.2× its featurisation CPU, benchmarks/RESULTS.md "Causal LMs"), else p = 512 with the
    dense Rademacher matrix (unchanged)."""
    if is_causal_lm(task):
        return LM_PROJ_DIM, "kronecker"
    return DEFAULT_PROJ_DIM, "rademacher"
