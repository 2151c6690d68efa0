"""The reference generator against the spec (docs/projection.md) and its statistics."""

import numpy as np
import pytest
import scipy.stats
import torch

from tests.fixtures.helpers import rademacher_entry
from trak_dist.projection import normal_block, rademacher_block


@pytest.mark.parametrize(
    ("seed", "model_id", "rows", "cols"),
    [
        (0, 0, (0, 40), (0, 300)),
        (7, 3, (1000, 1013), (120, 390)),
        (2**40 + 5, 2**32 - 1, (2**33 - 5, 2**33 + 5), (5, 9)),
    ],
)
def test_rademacher_entries_follow_the_spec(seed, model_id, rows, cols):
    block = rademacher_block(seed, model_id, *rows, *cols)
    rng = np.random.default_rng(seed % 1000)
    for _ in range(60):
        i = int(rng.integers(*rows))
        j = int(rng.integers(*cols))
        assert block[i - rows[0], j - cols[0]].item() == rademacher_entry(seed, model_id, i, j)


def test_blocks_tile_the_matrix():
    full = rademacher_block(3, 1, 0, 700, 0, 520)
    assert torch.equal(rademacher_block(3, 1, 123, 456, 77, 511), full[123:456, 77:511])
    nfull = normal_block(3, 1, 0, 300, 0, 101)
    assert torch.equal(normal_block(3, 1, 17, 250, 33, 100), nfull[17:250, 33:100])


def test_prefix_property():
    wide = rademacher_block(5, 2, 0, 400, 0, 1024)
    assert torch.equal(rademacher_block(5, 2, 0, 400, 0, 513), wide[:, :513])
    nwide = normal_block(5, 2, 0, 400, 0, 64)
    assert torch.equal(normal_block(5, 2, 0, 400, 0, 31), nwide[:, :31])


def test_model_id_and_seed_change_the_matrix():
    a = rademacher_block(0, 0, 0, 256, 0, 256)
    assert (a != rademacher_block(0, 1, 0, 256, 0, 256)).float().mean() > 0.4
    assert (a != rademacher_block(1, 0, 0, 256, 0, 256)).float().mean() > 0.4


def test_rademacher_signs_are_balanced_and_columns_uncorrelated():
    d, p = 4096, 256
    P = rademacher_block(11, 0, 0, d, 0, p).double()
    # mean of d·p fair signs: std 1/sqrt(d·p) ≈ 0.001; 5 sigma
    assert abs(P.mean().item()) < 5 / np.sqrt(d * p)
    corr = (P.T @ P / d).fill_diagonal_(0)
    # each off-diagonal correlation ~ N(0, 1/d); the max of ~32k of them stays under 5.5 sigma
    assert corr.abs().max().item() < 5.5 / np.sqrt(d)
    # and their spread matches 1/d (a correlated generator inflates it)
    off = corr[~torch.eye(p, dtype=torch.bool)]
    assert abs(off.var().item() * d - 1) < 0.05


def test_jl_norm_preservation():
    """E|Pᵀg|²/p = |g|²; relative deviation has std sqrt(2/p) for Rademacher P."""
    d, p, trials = 2000, 1024, 64
    g = torch.randn(trials, d, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    for gen in (rademacher_block, normal_block):
        P = gen(9, 4, 0, d, 0, p, dtype=torch.float64)
        ratio = ((g @ P).pow(2).sum(1) / p) / g.pow(2).sum(1)
        sigma = np.sqrt(2 / p)
        assert (ratio - 1).abs().max().item() < 5 * sigma
        assert abs(ratio.mean().item() - 1) < 4 * sigma / np.sqrt(trials)


def test_normal_entries_are_standard_normal():
    z = normal_block(2, 0, 0, 500, 0, 200, dtype=torch.float64).reshape(-1).numpy()
    assert scipy.stats.kstest(z, "norm").pvalue > 1e-3
