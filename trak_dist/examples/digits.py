"""The embedded default: scikit-learn's 8×8 digits (no download), a small MLP, a few checkpoints.

1500 train images, 297 targets; checkpoints trained on first use, cached under
``$TRAK_DIST_CACHE`` (default ``.trak_cache``). ``train_subset`` is ``trak-dist eval``'s recipe;
``arch="cnn"`` / ``"transformer"`` serve the LDS benchmark."""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from pathlib import Path

import numpy as np
import torch
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import TensorDataset

from trak_dist.examples._cache import cached_state, example_dir
from trak_dist.examples._digits_nets import ARCHS, build

__all__ = [
    "ARCHS",
    "accuracy",
    "checkpoints",
    "labels",
    "make_model",
    "target_set",
    "train_set",
    "train_subset",
]

N_TRAIN = 1500
HIDDEN = 32
EPOCHS = {"mlp": 15, "cnn": 15, "transformer": 20}
LR = {"mlp": 1e-2, "cnn": 1e-2, "transformer": 3e-3}


def _tensors() -> tuple[torch.Tensor, torch.Tensor]:
    digits = load_digits()
    x = torch.tensor(digits.data / 16.0, dtype=torch.float32)
    y = torch.tensor(digits.target, dtype=torch.int64)
    return x, y


def train_set() -> TensorDataset:
    """``(image [64], label)`` for the first 1500 digits."""
    x, y = _tensors()
    return TensorDataset(x[:N_TRAIN], y[:N_TRAIN])


def target_set() -> TensorDataset:
    """The remaining 297 digits."""
    x, y = _tensors()
    return TensorDataset(x[N_TRAIN:], y[N_TRAIN:])


def make_model(hidden: int = HIDDEN, arch: str = "mlp") -> nn.Module:
    """The classifier: ``[B, 64]`` images → ``[B, 10]`` logits; ``arch`` in ``ARCHS``."""
    return build(arch, hidden)


def _seeded_model(seed: int, hidden: int, arch: str) -> nn.Module:
    torch.manual_seed(seed)
    return make_model(hidden, arch)


def train_subset(
    indices: Sequence[int] | np.ndarray,
    seed: int,
    arch: str = "mlp",
    hidden: int = HIDDEN,
    epochs: int | None = None,
) -> dict[str, torch.Tensor]:
    """The training recipe: a model trained on train examples ``indices`` from ``seed`` (Adam,
    batches of 128, ``epochs`` passes, default ``EPOCHS``); deterministic on one thread."""
    model = _seeded_model(seed, hidden, arch)
    x, y = train_set().tensors
    idx = torch.as_tensor(np.asarray(indices, dtype=np.int64))
    x, y = x[idx], y[idx]
    opt = torch.optim.Adam(model.parameters(), lr=LR[arch])
    gen = torch.Generator().manual_seed(seed)
    for _ in range(EPOCHS[arch] if epochs is None else epochs):
        for b in torch.randperm(len(x), generator=gen).split(128):
            opt.zero_grad()
            nn.functional.cross_entropy(model(x[b]), y[b]).backward()
            opt.step()
    return model.state_dict()


def checkpoints(
    num: int = 3,
    epochs: int | None = None,
    cache_dir: str | None = None,
    hidden: int = HIDDEN,
    arch: str = "mlp",
) -> list[Path]:
    """Paths of ``num`` checkpoints trained on the whole train set from seeds 0, 1, …, training
    (≈1 s each) the ones not cached yet."""
    _seeded_model(0, hidden, arch)  # a bad arch fails here, before any file is written
    epochs = EPOCHS[arch] if epochs is None else epochs
    root = example_dir("digits", cache_dir)
    name = f"mlp{hidden}" if arch == "mlp" else arch
    return [
        cached_state(
            root / f"{name}_seed{seed}_ep{epochs}.pt",
            partial(train_subset, np.arange(N_TRAIN), seed, arch, hidden, epochs),
        )
        for seed in range(num)
    ]


def accuracy(path: Path) -> float:
    """Target-set accuracy of a checkpoint (for the report)."""
    model = make_model()
    model.load_state_dict(torch.load(path, weights_only=True))
    x, y = target_set().tensors
    with torch.no_grad():
        return float((model(x).argmax(1) == y).float().mean())


def labels() -> tuple[np.ndarray, np.ndarray]:
    """Train and target labels, to show whether proponents share their target's label."""
    _, y = _tensors()
    return y[:N_TRAIN].numpy(), y[N_TRAIN:].numpy()
