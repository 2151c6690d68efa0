"""One subset model: train it with the user's recipe, measure its output on every target.
A plain class: the eval driver wraps ``SubsetTrainer.margins`` in a Ray task."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from trak_dist.batches import Batch, to_device
from trak_dist.config import JobConfig
from trak_dist.errors import ConfigError
from trak_dist.sources import batch_of, build_dataset, build_model, load_object
from trak_dist.tasks import resolve_task


def _samples(batch: Batch) -> list[Any]:
    return [batch] if isinstance(batch, Mapping) else list(batch)


class SubsetTrainer:
    """Trains subset models with ``cfg.eval.recipe`` and returns their target outputs: the
    task's f per target, from batched ``get_outputs`` where it has one, else ``get_output``
    under vmap. ``threads``: torch threads (a Ray task gets ``eval.cpus_per_model``)."""

    def __init__(self, cfg: JobConfig, threads: int = 1) -> None:
        torch.set_num_threads(max(1, threads))
        self.cfg = cfg
        self.recipe = load_object(cfg.eval.recipe, "eval.recipe")
        if not callable(self.recipe):
            raise ConfigError(f"eval.recipe={cfg.eval.recipe!r} is not callable.")
        self.task = resolve_task(cfg.task.name, **cfg.task.kwargs)
        self.targets = build_dataset(cfg.data.targets, cfg.data.kwargs, "data.targets")
        device = cfg.eval.device
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(device)

    def state_dict(self, indices: np.ndarray, seed: int) -> dict[str, torch.Tensor]:
        """``recipe(indices, seed, **recipe_kwargs)``, checked to be a state dict."""
        kwargs = self.cfg.eval.recipe_kwargs
        try:
            # a writable copy: arrays from Ray's object store are read-only
            state = self.recipe(np.array(indices, dtype=np.int64), seed, **kwargs)
        except TypeError as e:
            raise ConfigError(
                f"eval.recipe={self.cfg.eval.recipe!r} failed when called as recipe(indices, "
                f"seed, **{kwargs}): {e}. A recipe is train(indices, seed, **recipe_kwargs) -> "
                "state_dict."
            ) from e
        if not isinstance(state, Mapping) or not all(
            isinstance(v, torch.Tensor) for v in state.values()
        ):
            raise ConfigError(
                f"eval.recipe={self.cfg.eval.recipe!r} returned {type(state).__name__}; it must "
                "return the trained model's state_dict() (a dict of tensors)."
            )
        return dict(state)

    def margins(self, indices: np.ndarray, seed: int) -> np.ndarray:
        """``[m]`` float32: the output on every target of a model trained on ``indices``."""
        model = build_model(self.cfg.model.factory, self.cfg.model.kwargs)
        try:
            model.load_state_dict(self.state_dict(indices, seed))
        except RuntimeError as e:
            raise ConfigError(
                f"eval.recipe={self.cfg.eval.recipe!r} returned a state dict that does not fit "
                f"model.factory's model ({str(e).splitlines()[0]}). The recipe must train the "
                "model whose checkpoints were featurised."
            ) from e
        model = model.to(self.device).eval()
        weights = {k: v.detach() for k, v in model.named_parameters()}
        buffers = {k: v.detach() for k, v in model.named_buffers()}

        def output(*sample: Any) -> torch.Tensor:
            return self.task.get_output(model, weights, buffers, *sample)

        # a task's batched get_outputs (the hook engine's entry) is the same f from a plain
        # forward pass: Hugging Face encoders' attention-mask code branches on tensor values,
        # which vmap refuses, so it is preferred where the task has one
        batched = getattr(self.task, "get_outputs", None)
        out = []
        m, step = len(self.targets), self.cfg.featurize.micro_batch
        with torch.no_grad():
            for t0 in range(0, m, step):
                b = to_device(batch_of(self.targets, t0, min(m, t0 + step)), self.device)
                if callable(batched):
                    f = batched(model, b)
                else:
                    f = torch.func.vmap(output, randomness="different")(*_samples(b))
                out.append(f.reshape(-1).float().cpu())
        return torch.cat(out).numpy()
