"""A real batch job on the digits example (Ray, ``trak_dist.api.run``) whose store the service
tests serve, and its stored scores, the reference every reply must equal."""

from __future__ import annotations

import socket
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

P = 128  # < n = 1500: λ = auto matters; the store is float16 (the default)
DIGITS = "trak_dist.examples.digits"
TOKEN = "test-token-0123456789abcdef"
MAX_BODY = 200_000


@dataclass(frozen=True)
class DigitsJob:
    store: str
    checkpoints: list[str]
    scores: np.ndarray  # [n, m] the batch job's score_set(...).scores()
    topk: dict[str, np.ndarray]
    lambdas: list[float]


@pytest.fixture(scope="session")
def digits_job(
    ray_session, tmp_path_factory: pytest.TempPathFactory, digits_checkpoints: list[Path]
) -> DigitsJob:
    import trak_dist.api
    from trak_dist.config import ScoringConfig
    from trak_dist.store import FeatureStore

    store = str(tmp_path_factory.mktemp("serve") / "store.zarr")
    ckpts = [str(c) for c in digits_checkpoints]
    result = trak_dist.api.run(
        model=f"{DIGITS}:make_model",
        checkpoints=ckpts,
        train=f"{DIGITS}:train_set",
        targets=f"{DIGITS}:target_set",
        store=store,
        proj_dim=P,
        lambda_reg="auto",
        scoring=ScoringConfig(topk=10),
        progress=False,
        report=None,
    )
    sset = FeatureStore.open(store, mode="r").score_set(result.exp, result.variant)
    assert sset is not None
    return DigitsJob(store, ckpts, sset.scores(), sset.read_topk(), list(sset.attrs["lambdas"]))


def serve_job(job: DigitsJob, **serve: object):  # -> JobConfig
    """The JobConfig `trak-dist serve` composes for ``job``'s store (digits data, defaults)."""
    from trak_dist.config import JobConfig, ModelConfig, ServeConfig, StoreConfig

    return JobConfig(
        proj_dim=P,
        lambda_reg="auto",
        model=ModelConfig(checkpoints=job.checkpoints),
        store=StoreConfig(path=job.store),
        serve=ServeConfig(**serve),  # type: ignore[arg-type]
        progress=False,
        report=None,
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def service(digits_job: DigitsJob, tmp_path_factory: pytest.TempPathFactory):
    from trak_dist import serve

    token_file = tmp_path_factory.mktemp("token") / "token"
    token_file.write_text(TOKEN + "\n")
    # loopback, but token mode forced: what a host beyond loopback gets
    cfg = serve_job(
        digits_job,
        port=_free_port(),
        token_file=str(token_file),
        require_token=True,
        max_targets=70,
        max_body_bytes=MAX_BODY,
        cpus_per_replica=0.5,
    )
    url = serve.start(cfg)
    yield url
    serve.stop()
