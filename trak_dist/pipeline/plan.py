"""What the driver does before any worker starts: resolve inputs, create the store, plan shards.
Every array is created here, in one process; workers only write whole chunks into them."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from torch.nn import Module

from trak_dist.config import JobConfig
from trak_dist.featurize import projection_params
from trak_dist.gradients import ParamLayout, resolve_engine
from trak_dist.pipeline._shards import ShardTask, auto_shard_rows, shard_plan
from trak_dist.projection import ProjectionKind, check_backend
from trak_dist.sources import build_dataset, build_model, checkpoint_paths
from trak_dist.store import (
    FeatureSpec,
    FeatureStore,
    dataset_fingerprint,
    dataset_row_hashes,
    file_fingerprint,
    fingerprint,
    resolve_chunk_rows,
)
from trak_dist.tasks import describe, resolve_curvature, resolve_task

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Prepared:
    """The resolved job: sizes, checkpoints and the shard tasks still to run."""

    store: FeatureStore
    checkpoints: list[Path | str]  # URLs stay URLs: each node reads its own copy
    n: int
    m: int
    grad_dim: int
    width: int
    proj_dim: int
    shard_rows: int
    train_tasks: list[ShardTask]
    target_tasks: list[ShardTask]
    # rows left out of the plan because the store holds them already (a checkpoint with its
    # XᵀX, committed target chunks): reused like the rows a worker finds committed
    rows_done: dict[str, int]


def check_combination(
    cfg: JobConfig, model: Module, task: Any, grad_wrt: tuple[str, ...] | None
) -> str:
    """Refuse, before any store is written or worker started, a gradient engine, projection
    and task that cannot work together; returns the engine workers will use.

    Raises:
        ConfigError: ``gradient_engine=hooks`` with a task lacking ``get_outputs`` or a
            parameter without a hook rule; a backend that cannot project ``projection.kind``.
    """
    device = None if cfg.featurize.device == "auto" else cfg.featurize.device
    check_backend(cfg.projection.kind, cfg.projection.backend, device)
    engine = resolve_engine(cfg.featurize.gradient_engine, model, task, grad_wrt)
    if engine == "vmap" and cfg.projection.kind == ProjectionKind.KRONECKER.value:
        # valid (the same features, tests/projection/test_kronecker.py), but it loses what
        # Kronecker is for: the hook engine never forms the per-sample gradient
        logger.warning(
            "projection.kind=kronecker with the vmap engine (gradient_engine=%s) forms every "
            "per-sample gradient (micro_batch × d = %d × %d floats) before sketching it; "
            "gradient_engine=hooks (or auto, where every selected parameter has a hook rule) "
            "never forms it.",
            cfg.featurize.gradient_engine,
            cfg.featurize.micro_batch,
            ParamLayout.of(model, grad_wrt).grad_dim,
        )
    return engine


def prepare(cfg: JobConfig) -> Prepared:
    checkpoints = checkpoint_paths(cfg.model.checkpoints)
    model = build_model(cfg.model.factory, cfg.model.kwargs)
    task = resolve_task(cfg.task.name, **cfg.task.kwargs)
    grad_wrt = None if cfg.task.grad_wrt is None else tuple(cfg.task.grad_wrt)
    layout = ParamLayout.of(model, grad_wrt)
    d = layout.grad_dim
    check_combination(cfg, model, task, grad_wrt)
    identity = cfg.projection.kind == ProjectionKind.IDENTITY.value
    width = d if identity else cfg.featurize_dim
    proj_dim = d if identity else cfg.proj_dim
    train = build_dataset(cfg.data.train, cfg.data.kwargs, "data.train")
    targets = build_dataset(cfg.data.targets, cfg.data.kwargs, "data.targets")
    n, m = len(train), len(targets)
    # every row hashed once (far cheaper than its gradient); a fingerprint given by the user
    # is trusted, and rows are still checked against their stored hashes when reused
    hashes: np.ndarray | None = None
    train_fp = cfg.data.train_fingerprint
    if not train_fp:
        hashes = dataset_row_hashes(train)
        train_fp = fingerprint(hashes)
    dtype = "float16" if cfg.featurize.half_precision else "float32"
    curvature = resolve_curvature(cfg.featurize.curvature, task)
    draws = cfg.featurize.fisher_draws if curvature == "fisher" else 0
    spec = FeatureSpec(
        proj_dim=width,
        projection=cfg.projection.kind,
        seed=cfg.projection.seed,
        grad_wrt=grad_wrt,
        model_output=describe(task),
        grad_dim=d,
        train_size=n,
        dataset_fingerprint=train_fp,
        dtype=dtype,
        chunk_rows=resolve_chunk_rows(
            cfg.store.chunk_rows,
            n,
            width * np.dtype(dtype).itemsize * (1 + draws),
            cfg.featurize.shard_rows,
            None
            if cfg.store.overwrite
            else FeatureStore.stored_spec(cfg.store.path, cfg.store.options),
        ),
        projection_params=projection_params(cfg.projection.kind, model, layout),
        curvature=curvature,
        fisher_draws=cfg.featurize.fisher_draws,  # > 1 with xtx: a ConfigError, nothing written
    )
    store = FeatureStore.create_or_open(
        cfg.store.path,
        spec,
        cfg.store.codec,
        overwrite=cfg.store.overwrite,
        row_hashes=hashes,
        options=cfg.store.options,
    )
    exp = cfg.scoring.exp_name
    store.ensure_experiment(exp, m, dataset_fingerprint(targets))
    chunk_rows = store.spec.chunk_rows
    shard_rows = cfg.featurize.shard_rows or auto_shard_rows(
        n, chunk_rows, cfg.cluster.num_workers or 4
    )
    train_tasks: list[ShardTask] = []
    target_tasks: list[ShardTask] = []
    rows_done = {"train": 0, "target": 0}
    for mid, path in enumerate(checkpoints):
        ckpt = file_fingerprint(path)
        store.ensure_checkpoint(mid, ckpt, str(path))
        if store.read_xtx(mid) is None:
            train_tasks += [
                ShardTask("train", mid, s, e) for s, e in shard_plan(n, chunk_rows, shard_rows)
            ]
        else:
            rows_done["train"] += n
        rows = store.ensure_target_checkpoint(exp, mid, ckpt, str(path))
        pending = [ShardTask("target", mid, s, e, exp) for s, e in rows.pending_ranges(shard_rows)]
        rows_done["target"] += m - sum(t.rows for t in pending)
        target_tasks += pending
    return Prepared(
        store,
        checkpoints,
        n,
        m,
        d,
        store.spec.proj_dim,
        proj_dim,
        shard_rows,
        train_tasks,
        target_tasks,
        rows_done,
    )
