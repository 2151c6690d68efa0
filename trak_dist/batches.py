"""Batches as the pipeline passes them around: a sequence of tensors (``(image, label)``) or a
mapping of named tensors (what Hugging Face tokenizers return), samples on dim 0 of each."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor
from torch.utils.data import default_collate

from trak_dist.errors import ConfigError

Batch = Sequence[Tensor] | Mapping[str, Tensor]


def _tensors(batch: Batch) -> list[Tensor]:
    values = list(batch.values()) if isinstance(batch, Mapping) else list(batch)
    if not values or not all(isinstance(v, Tensor) for v in values):
        raise ConfigError(
            f"a batch must be a non-empty tuple/list or dict of tensors; got "
            f"{type(batch).__name__} of {[type(v).__name__ for v in values]}."
        )
    return values


def batch_size(batch: Batch) -> int:
    """B, the length of dim 0 (the same for every tensor of the batch)."""
    sizes = {int(t.shape[0]) if t.dim() else -1 for t in _tensors(batch)}
    if len(sizes) != 1 or -1 in sizes:
        raise ConfigError(
            f"the tensors of a batch must share their first (sample) dimension; got sizes "
            f"{sorted(sizes)}."
        )
    return sizes.pop()


def _map(batch: Batch, fn: object) -> Batch:
    if isinstance(batch, Mapping):
        return {k: fn(v) for k, v in batch.items()}  # type: ignore[operator]
    return [fn(v) for v in batch]  # type: ignore[operator]


def slice_batch(batch: Batch, start: int, end: int) -> Batch:
    """Samples ``[start, end)``."""
    return _map(batch, lambda t: t[start:end])


def select(batch: Batch, rows: Tensor) -> Batch:
    """The samples picked by ``rows`` (a ``[B]`` bool mask or an index tensor)."""
    return _map(batch, lambda t: t[rows.to(t.device)])


def to_device(batch: Batch, device: torch.device | str) -> Batch:
    return _map(batch, lambda t: t.to(device))


def micro_batches(batch: Batch, step: int | None) -> list[Batch]:
    """The batch cut into consecutive pieces of ``step`` samples (None: the whole batch)."""
    size = batch_size(batch)
    step = size if step is None else step
    return [slice_batch(batch, i, i + step) for i in range(0, size, step)]


def batch_of(dataset: Any, start: int, end: int) -> Batch:
    """Items ``[start, end)`` collated: a list of batched tensors, or a dict of them when the
    items are dicts (Hugging Face style)."""
    batch = default_collate([dataset[i] for i in range(start, end)])
    if isinstance(batch, Mapping):
        return dict(batch)
    return list(batch) if isinstance(batch, Sequence) else [batch]
