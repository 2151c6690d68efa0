"""A small digits job and its single-process reference, for the pipeline tests."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import numpy as np
import torch

from trak_dist import TRAKer
from trak_dist.config import (
    ClusterConfig,
    FeaturizeConfig,
    JobConfig,
    ModelConfig,
    ProjectionConfig,
    StoreConfig,
)
from trak_dist.examples import digits
from trak_dist.pipeline import InProcessExecutor, JobResult, run_pipeline
from trak_dist.store import FeatureStore, variant_name

P, LAMBDA, CHUNK = 64, 1e-2, 64
WIDE = 64  # hidden width of the Kronecker jobs' MLP: its first layer [64, 64] uses hook factors


def small_job(
    store: Path,
    checkpoints: list[Path],
    workers: int = 2,
    shard_rows: int | None = 256,
    **featurize,
) -> JobConfig:
    return JobConfig(
        proj_dim=P,
        lambda_reg=LAMBDA,
        model=ModelConfig(checkpoints=[str(c) for c in checkpoints]),
        featurize=FeaturizeConfig(
            micro_batch=32, shard_rows=shard_rows, half_precision=False, **featurize
        ),
        store=StoreConfig(path=str(store), chunk_rows=CHUNK),
        cluster=ClusterConfig(num_workers=workers),
        progress=False,
        report=None,
    )


def kron_job(
    store: Path, checkpoints: list[Path], workers: int = 2, **featurize: object
) -> JobConfig:
    """``small_job`` with the Kronecker projection on the digits MLP of width ``WIDE`` (and
    ``trak_dist.run``'s default chunks of 256 rows)."""
    cfg = small_job(store, checkpoints, workers, shard_rows=256, **featurize)
    model = ModelConfig(kwargs={"hidden": WIDE}, checkpoints=[str(c) for c in checkpoints])
    return dataclasses.replace(
        cfg,
        model=model,
        projection=ProjectionConfig(kind="kronecker"),
        store=dataclasses.replace(cfg.store, chunk_rows=256),
    )


def stored_features(cfg: JobConfig) -> tuple[np.ndarray, np.ndarray]:
    """Every checkpoint's train X ``[C, n, p]`` and the scores of the job's variant."""
    store = FeatureStore.open(cfg.store.path, mode="r")
    xs = [store.train_rows(m).read(0, store.spec.train_size) for m in store.checkpoint_ids()]
    return np.stack(xs), job_scores(cfg)


def job_scores(cfg: JobConfig) -> np.ndarray:
    store = FeatureStore.open(cfg.store.path, mode="r")
    sset = store.score_set(cfg.scoring.exp_name, variant_name(P, LAMBDA))
    assert sset is not None
    return sset.scores()


def traker_scores(save_dir: Path, checkpoints: list[Path]) -> np.ndarray:
    """The same job through the single-process TRAKer API."""
    train, targets = digits.train_set(), digits.target_set()
    t = TRAKer(
        model=digits.make_model(),
        task="image_classification",
        train_set_size=len(train),
        save_dir=save_dir,
        device="cpu",
        proj_dim=P,
        lambda_reg=LAMBDA,
        use_half_precision=False,
        chunk_rows=CHUNK,
        logging_level=logging.ERROR,
    )
    states = [torch.load(c, weights_only=True) for c in checkpoints]
    for i, st in enumerate(states):
        t.load_checkpoint(st, model_id=i)
        t.featurize(train.tensors, num_samples=len(train))
    t.finalize_features()
    for i, st in enumerate(states):
        t.start_scoring_checkpoint("targets", st, model_id=i, num_targets=len(targets))
        t.score(targets.tensors, num_samples=len(targets))
    return np.asarray(t.finalize_scores("targets"))


def run_in_process(cfg: JobConfig, reverse: bool = False) -> JobResult:
    """The whole pipeline on the in-process executor (``reverse``: the shards in reverse order,
    as they may finish on several workers)."""
    return run_pipeline(cfg, InProcessExecutor(reverse=reverse))
