"""Real batch jobs (Ray) whose stores the service tests serve: the digits example
(``trak_dist.api.run``) and a tiny causal LM on JSONL text (``data=text``); their stored scores
are the reference every reply must equal. One Serve application runs at a time (``Services``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fixtures import llm_models
from tests.fixtures.serve import (
    DIGITS,
    MAX_BODY,
    TOKEN,
    DigitsJob,
    LmJob,
    P,
    Services,
    free_port,
    lm_config,
    serve_job,
    with_serve,
)


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
def lm_job(ray_session, tmp_path_factory: pytest.TempPathFactory) -> LmJob:
    import json

    from trak_dist.distributed.driver import run_job
    from trak_dist.store import FeatureStore

    root = tmp_path_factory.mktemp("lm")
    ckpts = llm_models.checkpoints(root, "llama", num=2, n_train=24, steps=10)
    cfg = lm_config(root, ckpts)
    result = run_job(cfg)
    sset = FeatureStore.open(cfg.store.path, mode="r").score_set(
        cfg.scoring.exp_name, result.scores[0].variant
    )
    assert sset is not None

    def read(name: str) -> list[dict]:
        return [json.loads(line) for line in (root / name).read_text().splitlines()]

    return LmJob(
        cfg,
        [r["text"] for r in read("train.jsonl")],
        read("targets.jsonl"),
        sset.scores(),
        sset.read_topk(),
    )


@pytest.fixture(scope="session")
def services(ray_session):  # torn down before the Ray session it serves on
    registry = Services()
    yield registry
    registry.close()


@pytest.fixture(scope="session")
def token_file(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("token") / "token"
    path.write_text(TOKEN + "\n")
    return str(path)


@pytest.fixture
def service(services: Services, digits_job: DigitsJob, token_file: str) -> str:
    """The digits job's service: loopback, but token mode forced (what a host beyond loopback
    gets)."""
    return services.get(
        "digits",
        lambda: serve_job(
            digits_job,
            port=free_port(),
            token_file=token_file,
            require_token=True,
            max_targets=70,
            max_body_bytes=MAX_BODY,
            cpus_per_replica=0.5,
        ),
    )


@pytest.fixture
def lm_service(services: Services, lm_job: LmJob) -> str:
    """The causal-LM text job's service (loopback, no token)."""
    return services.get(
        "lm", lambda: with_serve(lm_job.cfg, port=free_port(), cpus_per_replica=0.5, max_explain=8)
    )
