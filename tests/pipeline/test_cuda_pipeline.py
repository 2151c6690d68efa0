"""The in-process pipeline and the featurizer on a GPU (``pytest -m gpu``; the GPU check,
``benchmarks/device_check.sh``, runs them): the same job with ``device=cuda`` (the CUDA
projection kernel, the Kronecker factors and scoring on cuda) gives the CPU job's features,
scores and proponents. No Ray: the in-process executor.

Tolerance 2⁻¹⁰, relative to each row's L2 norm (X) and to the largest score (S): per-sample
gradients summed in another order on the GPU and the kernel's fp32 split (≤ 2⁻¹⁶ per entry)
stay far below it; a wrong sign or a lost block does not."""

from __future__ import annotations

import dataclasses
import logging

import numpy as np
import pytest
import torch

from tests.fixtures.hf_models import gpt2_lm, padded_tokens
from tests.fixtures.pipeline import WIDE, kron_job, run_in_process, small_job, stored_features
from trak_dist.config import ScoringConfig
from trak_dist.examples import digits
from trak_dist.featurize import build_featurizer
from trak_dist.gradients import HookGradientComputer
from trak_dist.projection._cuda import CudaProjector
from trak_dist.tasks import resolve_task

TOL = 2.0**-10
GPU = pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="needs a CUDA GPU: run `pytest -m gpu` on a GPU machine after `make cuda`",
)
JOBS = {"rademacher": small_job, "kronecker": kron_job}


@pytest.fixture(scope="module")
def wide_checkpoints(tmp_path_factory):
    """Checkpoints of the digits MLP of width WIDE, whose layers kron_job projects by factors."""
    cache = tmp_path_factory.mktemp("cache")
    return digits.checkpoints(num=2, epochs=3, cache_dir=str(cache), hidden=WIDE)


def _close(x: np.ndarray, x0: np.ndarray) -> float:
    """The largest error of a row of ``x`` relative to the L2 norm of ``x0``'s row."""
    return float((np.abs(x - x0).max(axis=-1) / np.linalg.norm(x0, axis=-1)).max())


@pytest.mark.gpu
@GPU
@pytest.mark.parametrize("kind", list(JOBS))
def test_job_on_cuda_gives_the_cpu_jobs_features_and_scores(
    kind, tmp_path, digits_checkpoints, wide_checkpoints, caplog
):
    checkpoints = digits_checkpoints if kind == "rademacher" else wide_checkpoints

    def job(device: str):
        cfg = JOBS[kind](tmp_path / f"{device}.zarr", checkpoints, 1, device=device)
        return dataclasses.replace(cfg, scoring=ScoringConfig(device=device))

    cuda, cpu = job("cuda"), job("cpu")
    with caplog.at_level(logging.WARNING, logger="trak_dist"):
        run_in_process(cuda)
    assert not [r for r in caplog.records if "unavailable" in r.getMessage()]  # no fallback
    run_in_process(cpu)
    (x, s), (x0, s0) = stored_features(cuda), stored_features(cpu)
    assert _close(x, x0) <= TOL
    assert float(np.abs(s - s0).max() / np.abs(s0).max()) <= TOL
    top, top0 = np.argsort(-s, axis=0)[:5], np.argsort(-s0, axis=0)[:5]
    assert (top == top0).all(axis=0).mean() >= 0.9  # near-ties may swap in a few columns


@pytest.mark.gpu
@GPU
@pytest.mark.parametrize("kind", ["rademacher", "kronecker"])
def test_causal_lm_features_on_cuda_match_the_cpu(kind):
    batch = padded_tokens(6, length=12)
    out = {}
    for device in ("cuda", "cpu"):
        hooks = HookGradientComputer(gpt2_lm(), resolve_task("causal_lm"), device=device)
        f = build_featurizer(hooks, kind, 256, micro_batch=4)
        if kind == "rademacher" and device == "cuda":
            assert isinstance(f.projector, CudaProjector)
        x, q = f.featurize(batch, model_id=0)
        out[device] = (x.numpy(), q.numpy())
    (x, q), (x0, q0) = out["cuda"], out["cpu"]
    assert _close(x, x0) <= TOL
    np.testing.assert_allclose(q, q0, rtol=1e-4, atol=1e-5)
