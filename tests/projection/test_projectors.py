import logging

import pytest
import torch

from trak_dist.errors import ConfigError
from trak_dist.projection import (
    GradBlock,
    IdentityProjector,
    TorchProjector,
    make_projector,
    rademacher_block,
)


def float32_atol(g: torch.Tensor) -> float:
    """Rounding allowance of a float32 sum of ±g: 8·eps·sqrt(d)·‖g‖ (errors grow like sqrt of
    the number of terms); a single wrong sign of P would be off by 2|g_i|, ~100× more."""
    return 8 * torch.finfo(torch.float32).eps * g.shape[1] ** 0.5 * g.norm(dim=1).max().item()


@pytest.mark.parametrize("kind", ["rademacher", "normal"])
@pytest.mark.parametrize("cache_bytes", [0, 1 << 30])
def test_torch_projector_equals_dense_product(kind, cache_bytes):
    d, p, b = 1000, 130, 5
    proj = TorchProjector(d, p, seed=4, kind=kind, cache_bytes=cache_bytes, block_rows=97)
    g = torch.randn(b, d, dtype=torch.float64)
    dense = proj.matrix(2).double()
    torch.testing.assert_close(proj.project(g.float(), 2).double(), g @ dense, rtol=1e-5, atol=1e-4)


# (d, p, batch, block_rows, cache_bytes, method): whole, partial and no packed cache, both
# products, d not a multiple of 8 or of block_rows, p not a multiple of 8 or 128
SHAPES = [
    (1003, 2048, 3, 200, 1 << 30, "auto"),  # lookup, whole P cached
    (1003, 2048, 3, 200, 0, "auto"),  # lookup, regenerated on every call
    (3001, 1100, 7, 512, 2 * 512 // 8 * 1100, "auto"),  # lookup, first 1024 rows cached
    (3001, 1100, 7, 512, 2 * 512 // 8 * 1100, "matmul"),
    (777, 300, 4, 64, 1 << 30, "auto"),  # matmul (p < LOOKUP_MIN_DIM)
    (777, 300, 4, 64, 1 << 30, "lookup"),
    (64, 1, 2, 8, 0, "matmul"),
    (64, 1, 2, 8, 0, "lookup"),
]


@pytest.mark.parametrize(("d", "p", "batch", "block_rows", "cache_bytes", "method"), SHAPES)
def test_rademacher_projection_equals_the_reference_product(
    d, p, batch, block_rows, cache_bytes, method
):
    proj = TorchProjector(
        d, p, seed=4, cache_bytes=cache_bytes, block_rows=block_rows, method=method
    )
    g = torch.randn(batch, d, dtype=torch.float64)
    refs = {m: g @ rademacher_block(4, m, 0, d, 0, p).double() for m in (0, 2)}
    for model_id in (2, 0, 2):  # the cache switches checkpoints and back
        ref = refs[model_id]
        got = proj.project(g.float(), model_id)
        assert got.shape == (batch, p) and got.dtype == torch.float32
        torch.testing.assert_close(got.double(), ref, rtol=1e-5, atol=float32_atol(g))


def test_lookup_on_several_threads():
    """Windows spread over torch's threads: the same projection; the thread count restored."""
    d, p = 5000, 1024
    g = torch.randn(3, d, dtype=torch.float64)
    ref = g @ rademacher_block(1, 0, 0, d, 0, p).double()
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(3)
        for cache_bytes in (1 << 30, 0):  # cached (filled before the threads start), regenerated
            proj = TorchProjector(d, p, seed=1, block_rows=512, cache_bytes=cache_bytes)
            got = proj.project(g.float(), 0)
            torch.testing.assert_close(got.double(), ref, rtol=1e-5, atol=float32_atol(g))
            assert torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(before)


def test_cache_rule():
    """Packed P: ceil(d/8)·p bytes, whole when it fits in cache_bytes, else whole windows."""
    cnn = TorchProjector(373_322, 2048)
    assert cnn.cached_groups * 2048 == 95_571_968  # 91 MiB: the whole P of a 373k CNN
    big = TorchProjector(26_000_000, 2048, block_rows=8192)
    assert big.cached_groups == 256 * 1024 and big.cached_groups * 2048 == 512 * 2**20
    assert TorchProjector(10_000, 2048, cache_bytes=0).cached_groups == 0
    partial = TorchProjector(10_000, 100, cache_bytes=1150 * 100, block_rows=800)
    assert partial.cached_groups == 1100  # 1150 fit; rounded down to windows of 100 groups
    proj = TorchProjector(1000, 1024)
    proj.project(torch.ones(1, 1000), 3)
    assert proj._cached is not None and proj._cached[0] == 3
    assert proj._cached[1].shape == (1024, 125) and proj._cached[1].dtype == torch.uint8
    proj.free_memory()
    assert proj._cached is None


def test_blocks_at_offsets_equal_the_concatenated_gradient():
    d, p = 900, 64
    proj = TorchProjector(d, p, seed=1, cache_bytes=0, block_rows=100)
    g = torch.randn(3, d)
    parts = [GradBlock(0, g[:, :250]), GradBlock(250, g[:, 250:251]), GradBlock(251, g[:, 251:])]
    torch.testing.assert_close(proj.project(parts, 0), proj.project(g, 0), rtol=1e-5, atol=1e-5)
    as_dict = {"a": g[:, :250].reshape(3, 25, 10), "b": g[:, 250:]}
    torch.testing.assert_close(proj.project(as_dict, 0), proj.project(g, 0), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("method", ["lookup", "matmul"])
def test_unaligned_overlapping_and_sparse_blocks(method):
    """Blocks in any order, at offsets that split bytes and windows, with gaps (zero rows) and
    overlaps (their gradients add), in any float dtype: the product of their sum with P."""
    d, p = 3000, 1030
    proj = TorchProjector(d, p, seed=6, block_rows=256, method=method)
    g = torch.randn(2, d, dtype=torch.float64)
    blocks = [
        GradBlock(1003, g[:, 1003:2900].half()),
        GradBlock(3, g[:, 3:700].float()),
        GradBlock(700, g[:, 700:1003]),  # float64
        GradBlock(600, g[:, 600:613].float()),  # overlaps the block at 3
    ]
    full = torch.zeros_like(g)
    for off, b in blocks:
        full[:, off : off + b.shape[1]] += b.double()
    ref = full @ rademacher_block(6, 0, 0, d, 0, p).double()
    torch.testing.assert_close(
        proj.project(blocks, 0).double(), ref, rtol=1e-5, atol=float32_atol(full)
    )


def test_prefix_of_projection():
    g = torch.randn(4, 500)
    wide = TorchProjector(500, 300, seed=2).project(g, 1)
    torch.testing.assert_close(TorchProjector(500, 129, seed=2).project(g, 1), wide[:, :129])
    # across products: p = 2048 by lookup; its first 1100 columns by lookup and by matmul, and
    # its first 129 by matmul (auto at p < LOOKUP_MIN_DIM)
    g = torch.randn(3, 2000)
    wide = TorchProjector(2000, 2048, seed=2).project(g, 1)
    for p, method in [(1100, "lookup"), (1100, "matmul"), (129, "auto")]:
        narrow = TorchProjector(2000, p, seed=2, method=method).project(g, 1)
        torch.testing.assert_close(narrow, wide[:, :p], rtol=1e-5, atol=float32_atol(g))


def test_block_outside_grad_dim_is_an_error():
    with pytest.raises(ConfigError, match="grad_wrt"):
        TorchProjector(10, 4).project([GradBlock(8, torch.ones(1, 5))], 0)


def test_identity_projector():
    g = torch.randn(2, 7)
    assert torch.equal(IdentityProjector(7).project(g, 0), g)
    with pytest.raises(ConfigError):
        IdentityProjector(7, 3)


def test_bad_arguments_name_the_value():
    with pytest.raises(ConfigError, match="model_id=-1"):
        TorchProjector(10, 4).project(torch.ones(1, 10), -1)
    with pytest.raises(ConfigError, match="proj_dim=0"):
        TorchProjector(10, 0)
    with pytest.raises(ConfigError, match="backend"):
        make_projector("rademacher", 10, 4, backend="fast")
    with pytest.raises(ConfigError, match="method='fast'"):
        TorchProjector(10, 4, method="fast")
    with pytest.raises(ConfigError, match="block_rows=0"):
        TorchProjector(10, 4, block_rows=0)


def test_cpu_device_uses_the_torch_reference(caplog):
    with caplog.at_level(logging.WARNING):
        proj = make_projector("rademacher", 64, 8, seed=0, device="cpu")
    assert isinstance(proj, TorchProjector)
    assert not caplog.records
    assert torch.equal(proj.matrix(0), rademacher_block(0, 0, 0, 64, 0, 8))
