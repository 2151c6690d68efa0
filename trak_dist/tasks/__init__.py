"""Model output functions (what TRAK attributes) and their out-to-loss weights Q."""

from __future__ import annotations

import importlib
from typing import Any

from trak_dist.errors import ConfigError
from trak_dist.tasks._base import BatchedOutput, ModelOutput, describe, margin
from trak_dist.tasks._classification import (
    ImageClassification,
    IterativeImageClassification,
    TextClassification,
)
from trak_dist.tasks._clip import CLIPOutput
from trak_dist.tasks._defaults import FISHER_DRAWS, TaskDefaults, is_causal_lm, task_defaults
from trak_dist.tasks._language import CausalLM
from trak_dist.tasks._sampled import (
    CURVATURES,
    SampledLabels,
    attach_uniforms,
    resolve_curvature,
)

__all__ = [
    "CURVATURES",
    "FISHER_DRAWS",
    "TASKS",
    "BatchedOutput",
    "CLIPOutput",
    "CausalLM",
    "ImageClassification",
    "IterativeImageClassification",
    "ModelOutput",
    "SampledLabels",
    "TaskDefaults",
    "TextClassification",
    "attach_uniforms",
    "describe",
    "is_causal_lm",
    "margin",
    "resolve_curvature",
    "resolve_task",
    "task_defaults",
]

TASKS: dict[str, type[ModelOutput]] = {
    "causal_lm": CausalLM,
    "image_classification": ImageClassification,
    "text_classification": TextClassification,
    "iterative_image_classification": IterativeImageClassification,
    "clip": CLIPOutput,
}


def resolve_task(task: Any, **kwargs: Any) -> Any:
    """A task instance from a name in ``TASKS``, a ``"package.module:Class"`` path, a class
    (instantiated with ``kwargs``), or an object with ``get_output`` and
    ``get_out_to_loss_grad`` (traker ``AbstractModelOutput`` instances qualify)."""
    if isinstance(task, str):
        if task in TASKS:
            return TASKS[task](**kwargs)
        if ":" in task:
            module, _, name = task.partition(":")
            try:
                obj = getattr(importlib.import_module(module), name)
            except (ImportError, AttributeError) as e:
                raise ConfigError(
                    f"task={task!r} could not be imported ({e}). Use 'package.module:Class' "
                    "with the package importable on every worker."
                ) from e
            return resolve_task(obj, **kwargs)
        raise ConfigError(
            f"task={task!r} is not a known task; expected one of {sorted(TASKS)} or "
            "'package.module:Class' naming a ModelOutput subclass."
        )
    if isinstance(task, type):
        return resolve_task(task(**kwargs))
    if not (hasattr(task, "get_output") and hasattr(task, "get_out_to_loss_grad")):
        raise ConfigError(
            f"task {task!r} lacks get_output/get_out_to_loss_grad; subclass "
            "trak_dist.tasks.ModelOutput (see its docstring)."
        )
    return task
