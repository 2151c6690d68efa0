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


@pytest.mark.parametrize("kind", ["rademacher", "normal"])
@pytest.mark.parametrize("cache_bytes", [0, 1 << 30])
def test_torch_projector_equals_dense_product(kind, cache_bytes):
    d, p, b = 1000, 130, 5
    proj = TorchProjector(d, p, seed=4, kind=kind, cache_bytes=cache_bytes, block_rows=97)
    g = torch.randn(b, d, dtype=torch.float64)
    dense = proj.matrix(2).double()
    torch.testing.assert_close(proj.project(g.float(), 2).double(), g @ dense, rtol=1e-5, atol=1e-4)


def test_blocks_at_offsets_equal_the_concatenated_gradient():
    d, p = 900, 64
    proj = TorchProjector(d, p, seed=1, cache_bytes=0, block_rows=100)
    g = torch.randn(3, d)
    parts = [GradBlock(0, g[:, :250]), GradBlock(250, g[:, 250:251]), GradBlock(251, g[:, 251:])]
    torch.testing.assert_close(proj.project(parts, 0), proj.project(g, 0), rtol=1e-5, atol=1e-5)
    as_dict = {"a": g[:, :250].reshape(3, 25, 10), "b": g[:, 250:]}
    torch.testing.assert_close(proj.project(as_dict, 0), proj.project(g, 0), rtol=1e-5, atol=1e-5)


def test_prefix_of_projection():
    g = torch.randn(4, 500)
    wide = TorchProjector(500, 300, seed=2).project(g, 1)
    torch.testing.assert_close(TorchProjector(500, 129, seed=2).project(g, 1), wide[:, :129])


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


def test_cpu_device_uses_the_torch_reference(caplog):
    with caplog.at_level(logging.WARNING):
        proj = make_projector("rademacher", 64, 8, seed=0, device="cpu")
    assert isinstance(proj, TorchProjector)
    assert not caplog.records
    assert torch.equal(proj.matrix(0), rademacher_block(0, 0, 0, 64, 0, 8))
