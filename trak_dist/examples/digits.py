"""The embedded default: scikit-learn's 8×8 digits, a small MLP, a few checkpoints.

1797 images ship with scikit-learn (no download). The first 1500 are the train set, the other
297 the targets. Checkpoints are trained from different seeds on first use and cached under
``$TRAK_DIST_CACHE`` (default ``.trak_cache`` in the working directory).
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import numpy as np
import torch
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import TensorDataset

from trak_dist.examples._cache import cached_state, example_dir

N_TRAIN = 1500
HIDDEN = 32


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


def make_model(hidden: int = HIDDEN) -> nn.Module:
    return nn.Sequential(nn.Linear(64, hidden), nn.Tanh(), nn.Linear(hidden, 10))


def _train(seed: int, epochs: int, hidden: int) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    model = make_model(hidden)
    x, y = train_set().tensors
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        for idx in torch.randperm(len(x), generator=gen).split(128):
            opt.zero_grad()
            nn.functional.cross_entropy(model(x[idx]), y[idx]).backward()
            opt.step()
    return model.state_dict()


def checkpoints(
    num: int = 3, epochs: int = 15, cache_dir: str | None = None, hidden: int = HIDDEN
) -> list[Path]:
    """Paths of ``num`` trained checkpoints, training (≈1 s each) the ones not cached yet."""
    root = example_dir("digits", cache_dir)
    return [
        cached_state(
            root / f"mlp{hidden}_seed{seed}_ep{epochs}.pt", partial(_train, seed, epochs, hidden)
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
