"""How the Kronecker projection sees each parameter (a matrix view) and orders its columns
(square shells of factor-column pairs); docs/projection.md#kronecker."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from typing import NamedTuple

import torch

from trak_dist.errors import ConfigError


class ParamView(NamedTuple):
    """One parameter's rows of the flat gradient as a ``[rows, cols]`` matrix: entry
    ``offset + r·cols + c`` is ``G[r, c]`` (the last row zero-padded)."""

    offset: int
    numel: int
    cols: int

    @property
    def rows(self) -> int:
        return -(-self.numel // self.cols)


def balanced_cols(numel: int) -> int:
    """Columns of the near-square view of a parameter without a module-given one."""
    return max(1, math.isqrt(numel - 1) + 1) if numel > 1 else 1


def factor_size(p: int) -> int:
    """k = ⌈√p⌉: the smallest square sketch with p entries."""
    return math.isqrt(p - 1) + 1


def shell_pairs(p: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(u, v)``, each ``[p]``: the sketch entry output column j reads.

    Columns fill square shells: shell s = ⌊√j⌋ holds the 2s + 1 pairs with max(u, v) = s, in the
    order (s, 0) … (s, s−1), (0, s) … (s−1, s), (s, s). Any prefix of columns therefore uses
    only factor columns < ⌈√p'⌉, and column j is the same for every p > j."""
    j = torch.arange(p, dtype=torch.int64)
    s = torch.sqrt(j.to(torch.float64)).floor().to(torch.int64)
    s = s - (s * s > j).to(torch.int64) + ((s + 1) * (s + 1) <= j).to(torch.int64)
    r = j - s * s
    u = torch.where(r < s, s, torch.where(r < 2 * s, r - s, s))
    v = torch.where(r < s, r, s)
    return u, v


def spec_params(views: Sequence[ParamView], share: str = "sum") -> str:
    """The column sharing, the pair order and a digest of the parameter views: with p, seed and
    d, what defines a Kronecker P (two models with the same d but differently viewed layers
    project differently)."""
    h = hashlib.blake2b(digest_size=8)
    for v in views:
        h.update(f"{v.offset},{v.numel},{v.cols};".encode())
    return f"share={share} pairs=shell views={h.hexdigest()}"


def check_views(views: tuple[ParamView, ...], grad_dim: int) -> None:
    at = 0
    for v in views:
        if v.offset != at or v.numel < 1 or v.cols < 1:
            raise ConfigError(
                f"Kronecker parameter views must tile [0, grad_dim) in order with positive "
                f"sizes; got {v} where offset {at} was expected."
            )
        at += v.numel
    if at != grad_dim:
        raise ConfigError(
            f"the Kronecker parameter views cover {at} gradient entries, grad_dim={grad_dim}; "
            "build them from the same grad_wrt as the gradient computer."
        )
