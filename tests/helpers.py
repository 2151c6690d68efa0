"""Small models, data and independent references shared by the tests."""

from __future__ import annotations

import copy

import numpy as np
import torch
from torch import nn

from trak_dist.tasks import margin

MASK = 0xFFFFFFFF


def mlp(din: int = 8, hidden: int = 8, classes: int = 3, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(din, hidden), nn.Tanh(), nn.Linear(hidden, classes))


def classification_data(n: int, din: int = 8, classes: int = 3, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, din, generator=g), torch.randint(0, classes, (n,), generator=g)


def philox_scalar(ctr: tuple[int, int, int, int], key: tuple[int, int]) -> tuple[int, ...]:
    """Philox4x32-10 on Python ints: an implementation independent of the tensor one."""
    c0, c1, c2, c3 = ctr
    k0, k1 = key
    for r in range(10):
        if r:
            k0, k1 = (k0 + 0x9E3779B9) & MASK, (k1 + 0xBB67AE85) & MASK
        p0, p1 = 0xD2511F53 * c0, 0xCD9E8D57 * c2
        c0, c1, c2, c3 = (p1 >> 32) ^ c1 ^ k0, p1 & MASK, (p0 >> 32) ^ c3 ^ k1, p0 & MASK
    return c0, c1, c2, c3


def rademacher_entry(seed: int, model_id: int, i: int, j: int) -> int:
    """P[i, j] straight from docs/projection.md."""
    x = philox_scalar((i & MASK, i >> 32, j >> 7, model_id), (seed & MASK, seed >> 32))
    return 1 - 2 * ((x[(j >> 5) & 3] >> (j & 31)) & 1)


def autograd_features(model: nn.Module, state: dict, x: torch.Tensor, y: torch.Tensor):
    """float64 per-sample margin gradients by an autograd loop, scaled by 1/sqrt(d): the
    identity-projection X of TRAK, computed without torch.func."""
    m = _double_copy(model, state)
    rows = []
    for i in range(len(x)):
        out = margin(m(x[i : i + 1].double()), y[i : i + 1]).sum()
        grads = torch.autograd.grad(out, list(m.parameters()))
        rows.append(torch.cat([g.reshape(-1) for g in grads]))
    g = torch.stack(rows)
    return g / np.sqrt(g.shape[1])


def _double_copy(model: nn.Module, state: dict) -> nn.Module:
    m = copy.deepcopy(model).double().eval()
    m.load_state_dict({k: v.double() for k, v in state.items()})
    return m


def q_of(model: nn.Module, state: dict, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    m = _double_copy(model, state)
    with torch.no_grad():
        p = torch.softmax(m(x.double()), -1)[torch.arange(len(x)), y]
    return 1 - p


def dense_trak_scores(model, states, x, y, xt, yt, lambda_reg: float, scaling: bool = True):
    """TRAK scores by a dense float64 solve (docs/design.md's formula), identity projection."""
    s, q = 0, 0
    for st in states:
        g, gt = autograd_features(model, st, x, y), autograd_features(model, st, xt, yt)
        k = g.T @ g + lambda_reg * torch.eye(g.shape[1], dtype=torch.float64)
        kinv = torch.linalg.inv(k)
        if scaling:
            kinv = kinv / kinv.abs().mean()
        s = s + g @ kinv @ gt.T
        q = q + q_of(model, st, x, y)
    c = len(states)
    return (s / c * (q / c)[:, None]).numpy()
