"""The packed sign layout and the table-lookup product against the reference generator."""

import pytest
import torch

from tests.fixtures.helpers import rademacher_entry
from trak_dist.projection import _lookup, rademacher_block
from trak_dist.projection._lookup import groups_per_call, lookup_accumulate
from trak_dist.projection._packed import expand_packed, packed_rademacher


@pytest.mark.parametrize(
    ("seed", "model_id", "groups", "p"),
    [
        (0, 0, (0, 50), 300),
        (7, 3, (5, 40), 129),
        (1, 2, (0, 3), 2048),
        (2**40 + 5, 2**32 - 1, (2**30 - 2, 2**30 + 2), 17),  # rows cross 2**32
        (3, 1, (0, 1), 1),
    ],
)
def test_packed_signs_are_the_reference_matrix(seed, model_id, groups, p):
    packed = packed_rademacher(seed, model_id, *groups, p)
    assert packed.shape == (p, groups[1] - groups[0]) and packed.dtype == torch.uint8
    ref = rademacher_block(seed, model_id, 8 * groups[0], 8 * groups[1], 0, p)
    assert torch.equal(expand_packed(packed).T, ref)


def test_packed_bits_follow_the_spec():
    """Bit k of byte [j, g] is set exactly where P[8g + k, j] = −1 (scalar hash, no tensors)."""
    packed = packed_rademacher(11, 4, 2**29 - 1, 2**29 + 1, 200)  # rows 2**32 - 8 … 2**32 + 7
    for j in (0, 1, 31, 32, 127, 128, 199):
        for g in range(2):
            for k in range(8):
                i = 8 * (2**29 - 1 + g) + k
                bit = (int(packed[j, g]) >> k) & 1
                assert 1 - 2 * bit == rademacher_entry(11, 4, i, j)


def test_generation_does_not_depend_on_the_range_asked_for():
    whole = packed_rademacher(5, 2, 0, 700, 260)
    assert torch.equal(packed_rademacher(5, 2, 123, 456, 260), whole[:, 123:456])
    assert torch.equal(packed_rademacher(5, 2, 0, 700, 100), whole[:100])  # prefix of columns


def float32_atol(g: torch.Tensor) -> float:
    """Rounding allowance of a float32 sum of ±g over groups of 8: 8·eps·sqrt(terms)·‖g‖.

    (The sums run over ``d/8`` table entries; their rounding errors grow like sqrt(terms).) A
    single wrong sign would be off by 2|g_i|, ~100× more at these sizes.
    """
    terms = g.shape[1] / 8
    return 8 * torch.finfo(torch.float32).eps * terms**0.5 * g.norm(dim=1).max().item()


@pytest.mark.parametrize("batch", [1, 3, 64, 300])
def test_lookup_product_equals_the_dense_product(batch, monkeypatch):
    # tables of 4 groups per call, so that 11 groups take three calls, the last one short
    monkeypatch.setattr(_lookup, "_TABLE_BYTES", 4 * 256 * 4 * batch)
    assert groups_per_call(batch) == 4
    groups, p = 11, 1100
    packed = packed_rademacher(9, 1, 0, groups, p)
    g = torch.randn(batch, 8 * groups, dtype=torch.float64)
    acc = torch.zeros(p, batch)
    lookup_accumulate(acc, g.T.float().contiguous(), packed)
    ref = g @ rademacher_block(9, 1, 0, 8 * groups, 0, p).double()
    torch.testing.assert_close(acc.T.double(), ref, rtol=1e-5, atol=float32_atol(g))
    before = acc.clone()
    lookup_accumulate(acc, g.T.float().contiguous(), packed)  # it accumulates
    torch.testing.assert_close(acc, 2 * before)
