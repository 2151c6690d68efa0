"""A real batch job on the digits example (Ray, ``trak_dist.api.run``) whose store the service
tests serve, and its stored scores, the reference every reply must equal."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fixtures.serve import DIGITS, MAX_BODY, TOKEN, DigitsJob, P, free_port, serve_job


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


@pytest.fixture(scope="session")
def service(digits_job: DigitsJob, tmp_path_factory: pytest.TempPathFactory):
    from trak_dist import serve

    token_file = tmp_path_factory.mktemp("token") / "token"
    token_file.write_text(TOKEN + "\n")
    # loopback, but token mode forced: what a host beyond loopback gets
    cfg = serve_job(
        digits_job,
        port=free_port(),
        token_file=str(token_file),
        require_token=True,
        max_targets=70,
        max_body_bytes=MAX_BODY,
        cpus_per_replica=0.5,
    )
    url = serve.start(cfg)
    yield url
    serve.stop()
