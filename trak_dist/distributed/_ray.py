"""The only module (with the driver) that imports Ray: wrappers, resources, cluster start."""

from __future__ import annotations

import atexit
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import ray

from trak_dist.config import ClusterConfig, JobConfig
from trak_dist.distributed.reducer import Reducer
from trak_dist.distributed.worker import Worker
from trak_dist.errors import ConfigError

logger = logging.getLogger(__name__)

RemoteWorker = ray.remote(Worker)
RemoteReducer = ray.remote(Reducer)


def connect(cluster: ClusterConfig) -> bool:
    """Start an in-process Ray (``local``) or join a running cluster; True if started here."""
    if ray.is_initialized():
        return False
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if cluster.kind == "local" and not cluster.address:
        wanted = (cluster.num_workers or 1) * cluster.cpus_per_worker
        cpus = max(os.cpu_count() or 1, int(wanted))
        # address="local": a fresh instance even when a `ray start` cluster (or a stale record
        # of one in /tmp/ray) exists on this machine; bare ray.init() would try to join it
        ray.init(
            address="local",
            num_cpus=cpus,
            include_dashboard=False,
            object_store_memory=cluster.object_store_mb * 2**20,
            logging_level=logging.WARNING,
        )
    else:
        # explicit only: Ray's "auto" also trusts a stale record of a dead cluster in /tmp/ray
        # and then retries its GCS for minutes
        address = cluster.address or os.environ.get("RAY_ADDRESS")
        if not address:
            raise ConfigError(
                f"cluster={cluster.kind} joins a running Ray cluster, but neither "
                "cluster.address nor RAY_ADDRESS is set. Run under `ray job submit` (which sets "
                "RAY_ADDRESS), pass cluster.address=HOST:6379, or use cluster=local to start Ray "
                "here."
            )
        try:
            ray.init(address=address, logging_level=logging.WARNING)
        except ConnectionError as e:
            raise ConfigError(
                f"could not join the Ray cluster at {address} ({e}). Check that its head runs "
                "(`ray status --address ...`) and that this machine can reach it."
            ) from e
    return True


def gpus_per_worker(cluster: ClusterConfig) -> float:
    if cluster.gpus_per_worker is not None:
        return cluster.gpus_per_worker
    return 1.0 if ray.cluster_resources().get("GPU", 0) >= 1 else 0.0


def worker_count(cluster: ClusterConfig, tasks: int) -> int:
    """Workers to start: the requested number (or what fits, when None), never more than the
    cluster can host at once (extra actors would wait for resources forever) or than tasks."""
    total = ray.cluster_resources()
    gpus = gpus_per_worker(cluster)
    fits = int(total.get("CPU", 0) // cluster.cpus_per_worker) if cluster.cpus_per_worker else tasks
    if gpus:
        fits = min(fits, int(total.get("GPU", 0) // gpus))
    wanted = cluster.num_workers or max(1, fits)
    if wanted > fits:
        logger.warning(
            "cluster.num_workers=%d but the cluster fits %d workers of %s CPU / %s GPU "
            "(it has %s CPU, %s GPU); starting %d.",
            wanted,
            fits,
            cluster.cpus_per_worker,
            gpus,
            total.get("CPU", 0),
            total.get("GPU", 0),
            max(1, fits),
        )
        wanted = max(1, fits)
    return max(1, min(wanted, tasks))


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


class Session:
    """Ray and reducers kept alive across run_job calls of one process (``keep_alive``): the
    jobs of a sweep then pay for neither a Ray start nor a reducer start after the first."""

    reducers: ClassVar[dict[tuple[str, str, float], Any]] = {}
    registered: ClassVar[bool] = False

    @classmethod
    def reducer(cls, cfg: JobConfig) -> Any:
        key = (str(cfg.store.path), cfg.scoring.device, cfg.cluster.reducer_gpus)
        if key not in cls.reducers:
            cls.reducers[key] = start_reducer(cfg)
        if not cls.registered:
            atexit.register(cls.close)
            cls.registered = True
        return cls.reducers[key]

    @classmethod
    def close(cls) -> None:
        cls.reducers.clear()
        if ray.is_initialized():
            ray.shutdown()
