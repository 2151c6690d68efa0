"""The only module (with the driver) that imports Ray: wrappers, resources, cluster start."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import ray

from trak_dist.config import ClusterConfig, JobConfig
from trak_dist.distributed.reducer import Reducer
from trak_dist.distributed.worker import Worker

logger = logging.getLogger(__name__)

RemoteWorker = ray.remote(Worker)
RemoteReducer = ray.remote(Reducer)


def connect(cluster: ClusterConfig) -> bool:
    """Start an in-process Ray (``local``) or join a running cluster; True if started here."""
    if ray.is_initialized():
        return False
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if cluster.kind == "local" and not cluster.address:
        cpus = max(os.cpu_count() or 1, int(cluster.num_workers * cluster.cpus_per_worker))
        ray.init(
            num_cpus=cpus,
            include_dashboard=False,
            object_store_memory=cluster.object_store_mb * 2**20,
            logging_level=logging.WARNING,
        )
    else:
        # "auto" finds the cluster of `ray job submit` (RAY_ADDRESS) or of `ray start` here
        ray.init(address=cluster.address or "auto", logging_level=logging.WARNING)
    return True


def gpus_per_worker(cluster: ClusterConfig) -> float:
    if cluster.gpus_per_worker is not None:
        return cluster.gpus_per_worker
    return 1.0 if ray.cluster_resources().get("GPU", 0) >= 1 else 0.0


def start_worker(cfg: JobConfig, checkpoints: Sequence[Path], width: int) -> Any:
    c = cfg.cluster
    return RemoteWorker.options(
        num_cpus=c.cpus_per_worker, num_gpus=gpus_per_worker(c), max_restarts=0
    ).remote(cfg, list(checkpoints), width)


def start_reducer(cfg: JobConfig) -> Any:
    # num_cpus=0: it idles while workers featurise, so it must not hold a worker's slot
    device = "cuda" if cfg.cluster.reducer_gpus > 0 else cfg.scoring.device
    return RemoteReducer.options(num_cpus=0, num_gpus=cfg.cluster.reducer_gpus).remote(
        cfg.store.path, device
    )


def stop(actors: Sequence[Any], grace_s: float = 5.0) -> None:
    """Ask actors to exit, then kill whatever is left after ``grace_s``."""
    live = [a for a in actors if a is not None]
    refs = [a.__ray_terminate__.remote() for a in live]
    if refs:
        ray.wait(refs, num_returns=len(refs), timeout=grace_s)
    for a in live:
        ray.kill(a)
