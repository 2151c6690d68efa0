"""The driver refuses an incompatible gradient engine / projection / task before it connects to
Ray or writes the store: one ConfigError naming the values and the fix, nothing on disk."""

from __future__ import annotations

import dataclasses
import logging
import os

import pytest
from torch import nn

from tests.fixtures.pipeline import kron_job, small_job
from trak_dist.config import ClusterConfig, FeaturizeConfig, ModelConfig, ProjectionConfig
from trak_dist.distributed import run_job
from trak_dist.errors import ConfigError
from trak_dist.pipeline import check_combination
from trak_dist.projection import make_projector
from trak_dist.sources import build_model
from trak_dist.tasks import resolve_task

# A Ray address where nothing listens: reaching _ray.connect would be a connection error (after
# Ray's retries), not the ConfigError these jobs must stop with first.
NOWHERE = ClusterConfig(kind="ray", address="127.0.0.1:1", num_workers=1)


def prelu_model() -> nn.Module:
    """The digits MLP with a PReLU, whose weight no hook rule covers."""
    return nn.Sequential(nn.Linear(64, 16), nn.PReLU(), nn.Linear(16, 10))


def _job(tmp_path, checkpoints, projection=None, **featurize):
    cfg = small_job(tmp_path / "s.zarr", checkpoints, **featurize)
    cfg = dataclasses.replace(cfg, cluster=NOWHERE)
    if projection is not None:
        cfg = dataclasses.replace(cfg, projection=projection)
    return cfg


def _refused(cfg, match: str) -> str:
    with pytest.raises(ConfigError, match=match) as info:
        run_job(cfg)
    assert not os.path.exists(cfg.store.path), "a refused job must leave no store behind"
    return str(info.value)


def test_hooks_forced_on_a_module_without_a_rule(tmp_path, digits_checkpoints):
    cfg = _job(tmp_path, digits_checkpoints, gradient_engine="hooks")
    cfg = dataclasses.replace(
        cfg, model=ModelConfig(factory=prelu_model, checkpoints=cfg.model.checkpoints)
    )
    message = _refused(cfg, "gradient_engine=hooks cannot compute")
    assert "'1.weight'" in message and "PReLU" in message
    assert "grad_wrt" in message and "gradient_engine=vmap" in message
    # leaving the PReLU out with grad_wrt is the fix the message names: then hooks can run
    task = resolve_task("image_classification")
    names = ("0.weight", "0.bias", "2.weight", "2.bias")
    assert check_combination(cfg, prelu_model(), task, names) == "hooks"


@pytest.mark.parametrize(
    ("kind", "backend", "device", "match"),
    [
        ("kronecker", "cuda", "auto", r"'kronecker' with backend=cuda.*backend=auto or torch"),
        ("normal", "cuda", "auto", r"'normal' with backend=cuda.*kind=rademacher"),
        (
            "rademacher",
            "cuda",
            "cpu",
            r"backend=cuda with device=cpu.*on a GPU",
        ),
    ],
)
def test_a_backend_that_cannot_project_the_kind(
    tmp_path, digits_checkpoints, kind, backend, device, match
):
    projection = ProjectionConfig(kind=kind, backend=backend)
    _refused(_job(tmp_path, digits_checkpoints, projection, device=device), match)


def test_make_projector_refuses_a_normal_matrix_on_the_rademacher_kernel():
    """It used to return the CUDA kernel's Rademacher projector for kind=normal."""
    with pytest.raises(ConfigError, match="'normal' with backend=cuda"):
        make_projector("normal", 100, 8, device="cuda", backend="cuda")
    with pytest.raises(ConfigError, match="backend='gpu'"):
        make_projector("rademacher", 100, 8, backend="gpu")


def test_kronecker_on_vmap_runs_but_says_what_it_costs(tmp_path, digits_checkpoints, caplog):
    """A valid combination (the same features as hooks, tests/projection/test_kronecker.py):
    not refused, but the warning says the gradient is formed."""
    cfg = kron_job(tmp_path / "k.zarr", digits_checkpoints, gradient_engine="vmap")
    model = build_model(cfg.model.factory, cfg.model.kwargs)
    task = resolve_task("image_classification")
    with caplog.at_level(logging.WARNING, logger="trak_dist"):
        assert check_combination(cfg, model, task, None) == "vmap"
    d = sum(p.numel() for p in model.parameters())
    assert [r.getMessage() for r in caplog.records] == [
        "projection.kind=kronecker with the vmap engine (gradient_engine=vmap) forms every "
        f"per-sample gradient (micro_batch × d = 32 × {d} floats) before sketching it; "
        "gradient_engine=hooks (or auto, where every selected parameter has a hook rule) "
        "never forms it."
    ]
    caplog.clear()
    hooks = dataclasses.replace(cfg, featurize=FeaturizeConfig(micro_batch=32))
    with caplog.at_level(logging.WARNING, logger="trak_dist"):
        assert check_combination(hooks, model, task, None) == "hooks"
    assert not caplog.records
