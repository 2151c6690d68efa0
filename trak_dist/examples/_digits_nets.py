"""Three small digit classifiers (MLP, CNN, transformer), ``[B, 64]`` → ``[B, 10]`` logits; the
transformer is written out by hand so vmap over ``functional_call`` sees plain tensor ops."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from trak_dist.errors import ConfigError

ARCHS = ("mlp", "cnn", "transformer")


class DigitsCNN(nn.Module):
    """Two 3×3 convolutions (8 → 4 pixels) and a linear head; 3.8k parameters."""

    def __init__(self, channels: int = 8) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, channels, 3, padding=1)
        self.conv2 = nn.Conv2d(channels, 2 * channels, 3, stride=2, padding=1)
        self.head = nn.Linear(2 * channels * 16, 10)

    def forward(self, x: Tensor) -> Tensor:
        h = torch.relu(self.conv1(x.reshape(-1, 1, 8, 8)))
        h = torch.relu(self.conv2(h))
        return self.head(h.flatten(1))


class DigitsTransformer(nn.Module):
    """One pre-norm transformer block over the image's 8 rows as tokens (9.5k parameters);
    ``width`` must divide by ``heads``."""

    def __init__(self, width: int = 32, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.embed = nn.Linear(8, width)
        self.pos = nn.Parameter(torch.randn(8, width) * 0.02)
        self.norm1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.out = nn.Linear(width, width)
        self.norm2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(
            nn.Linear(width, 2 * width), nn.GELU(), nn.Linear(2 * width, width)
        )
        self.norm3 = nn.LayerNorm(width)
        self.head = nn.Linear(width, 10)

    def attention(self, h: Tensor) -> Tensor:
        """``[B, T, W]`` → ``[B, T, W]``: softmax(QKᵀ/√k) V per head."""
        b, t, w = h.shape
        q, k, v = self.qkv(h).reshape(b, t, 3, self.heads, w // self.heads).unbind(2)
        q, k, v = (z.transpose(1, 2) for z in (q, k, v))  # [B, H, T, k]
        att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]), dim=-1)
        return self.out((att @ v).transpose(1, 2).reshape(b, t, w))

    def forward(self, x: Tensor) -> Tensor:
        h = self.embed(x.reshape(-1, 8, 8)) + self.pos
        h = h + self.attention(self.norm1(h))
        h = h + self.mlp(self.norm2(h))
        return self.head(self.norm3(h.mean(1)))


def build(arch: str, hidden: int) -> nn.Module:
    """The network ``arch`` (one of ``ARCHS``); ``hidden`` is the MLP's width."""
    if arch == "mlp":
        return nn.Sequential(nn.Linear(64, hidden), nn.Tanh(), nn.Linear(hidden, 10))
    if arch == "cnn":
        return DigitsCNN()
    if arch == "transformer":
        return DigitsTransformer()
    raise ConfigError(f"model.kwargs.arch={arch!r}; expected one of {ARCHS}.")
