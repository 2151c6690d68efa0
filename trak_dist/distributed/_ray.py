"""The only module (with the driver) that imports Ray: wrappers, resources, cluster start."""

from __future__ import annotations

import atexit
import logging
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar

import ray
from ray._private import ray_constants
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from trak_dist.config import ClusterConfig, JobConfig
from trak_dist.distributed._interrupt import keep_sigterm
from trak_dist.errors import ConfigError
from trak_dist.pipeline import Reducer, Worker, reducer_device
from trak_dist.scoring import Scorer

logger = logging.getLogger(__name__)

RemoteWorker = ray.remote(Worker)
RemoteReducer = ray.remote(Reducer)
RemoteScorer = ray.remote(Scorer)


# Ray 2.60 has no single "loopback only" switch for ray.init; together these are one
# (tests/faults/test_runtime_faults.py lists the sockets of a running job's Ray processes):
# - the node IP 127.0.0.1. ray.init rewrites a loopback _node_ip_address to the machine's
#   routable address unless ray_constants.ENABLE_RAY_CLUSTER is false (its env var, for the
#   processes it spawns). With a loopback node IP, the GCS, raylet, workers' gRPC servers, the
#   dashboard agent and the runtime-env agent all bind 127.0.0.1 instead of every interface.
# - enable_metrics_collection=False: the dashboard agent starts no Prometheus exporter.
# - The autoscaler monitor and the dashboard head start a Prometheus endpoint on fixed ports
#   (44217, 44227) whatever include_dashboard says; port -1 cannot be bound, so each logs one
#   error in Ray's session logs and serves nothing.
LOOPBACK_ENV = {
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    "AUTOSCALER_METRIC_PORT": "-1",
    "DASHBOARD_METRIC_PORT": "-1",
}

AUTH_LOGGER = "ray._private.authentication.authentication_token_setup"


@contextmanager
def _loopback() -> Iterator[None]:
    """Environment and Ray constant for starting a loopback-only node, restored afterwards (a
    later ray.init in this process may join a real cluster)."""
    saved_env = {k: os.environ.get(k) for k in LOOPBACK_ENV}
    saved_flag = ray_constants.ENABLE_RAY_CLUSTER
    # Ray turns token authentication on for a new local cluster (kept: other users of this
    # machine can reach 127.0.0.1) and says so in a warning line on every run; quiet it
    auth_log = logging.getLogger(AUTH_LOGGER)
    saved_level = auth_log.level
    os.environ.update(LOOPBACK_ENV)
    ray_constants.ENABLE_RAY_CLUSTER = False
    auth_log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        auth_log.setLevel(saved_level)
        ray_constants.ENABLE_RAY_CLUSTER = saved_flag
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def shutdown() -> None:
    """``ray.shutdown``, keeping the process's SIGTERM handler (``keep_sigterm``)."""
    with keep_sigterm():
        ray.shutdown()


def machine_cpus() -> int:
    """CPUs this process may run on (its affinity mask, e.g. a SLURM or taskset allocation)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def connect(cluster: ClusterConfig) -> bool:
    """Start an in-process Ray (``local``) or join a running cluster; True if started here.
    The local Ray gets the machine's real CPUs (so ``worker_count`` fits the cores) and
    listens on loopback only, without metrics endpoints."""
    if ray.is_initialized():
        return False
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    with keep_sigterm():
        _init(cluster)
    return True


def _init(cluster: ClusterConfig) -> None:
    if cluster.kind in ("local", "inprocess") and not cluster.address:
        # address="local": a fresh instance even when a `ray start` cluster (or a stale record
        # of one in /tmp/ray) exists on this machine; bare ray.init() would try to join it
        with _loopback():
            ray.init(
                address="local",
                num_cpus=machine_cpus(),
                include_dashboard=False,
                object_store_memory=cluster.object_store_mb * 2**20,
                logging_level=logging.WARNING,
                _node_ip_address="127.0.0.1",
                _system_config={"enable_metrics_collection": False},
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


def gpus_per_worker(cluster: ClusterConfig) -> float:
    if cluster.gpus_per_worker is not None:
        return cluster.gpus_per_worker
    return 1.0 if ray.cluster_resources().get("GPU", 0) >= 1 else 0.0


_CAPPED: set[str] = set()


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
        message = (
            f"cluster.num_workers={wanted} but the cluster fits {fits} workers of "
            f"{cluster.cpus_per_worker:g} CPU / {gpus:g} GPU (it has {total.get('CPU', 0):g} "
            f"CPU, {total.get('GPU', 0):g} GPU); starting {max(1, fits)}: more would only "
            "compete for the same resources."
        )
        # featurisation workers and score actors are sized by the same rule: say it once
        if message not in _CAPPED:
            _CAPPED.add(message)
            logger.warning(message)
        wanted = max(1, fits)
    return max(1, min(wanted, tasks))


def start_worker(cfg: JobConfig, checkpoints: Sequence[Path | str], width: int) -> Any:
    c = cfg.cluster
    return RemoteWorker.options(
        num_cpus=c.cpus_per_worker, num_gpus=gpus_per_worker(c), max_restarts=0
    ).remote(cfg, list(checkpoints), width)


def start_scorer(cfg: JobConfig) -> Any:
    """A score-block worker with a featurisation worker's resources (score blocks run after
    every shard, on the slots the featurisation workers held)."""
    c = cfg.cluster
    return RemoteScorer.options(
        num_cpus=c.cpus_per_worker, num_gpus=gpus_per_worker(c), max_restarts=0
    ).remote(cfg.store.path, reducer_device(cfg), cfg.store.options)


def start_reducer(cfg: JobConfig) -> Any:
    # num_cpus=0: it idles while workers featurise, so it must not hold a worker's slot.
    # Without a GPU, on the driver's node: the job ends with that node anyway, while a reducer
    # on a worker node would make that node's loss end the job too (it holds the partial XᵀX
    # sums in memory). Hard affinity: under soft affinity Ray 2.60 placed such a zero-resource
    # actor on another node 3 times in 4 (tests/multinode). With a GPU, wherever one is free.
    gpus = cfg.cluster.reducer_gpus
    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
    placement: dict[str, Any] = {} if gpus else {"scheduling_strategy": here}
    return RemoteReducer.options(num_cpus=0, num_gpus=gpus, **placement).remote(
        cfg.store.path, reducer_device(cfg), cfg.store.options
    )


def stop(actors: Sequence[Any], grace_s: float = 5.0, force: bool = False) -> None:
    """Ask actors to exit (wait ``grace_s``; not when ``force``, e.g. on Ctrl-C), kill whatever
    is left, and wait (up to ``grace_s``) until they are gone."""
    live = [a for a in actors if a is not None]
    if not live:
        return
    if not force:
        refs = [a.__ray_terminate__.remote() for a in live]
        ray.wait(refs, num_returns=len(refs), timeout=grace_s)
    for a in live:
        ray.kill(a)
    # ray.kill only asks the GCS; a ray.shutdown right after could stop the GCS first and leave
    # a busy worker computing on its own. A call to a killed actor fails once it is dead.
    probes = [a.__ray_ready__.remote() for a in live]
    ray.wait(probes, num_returns=len(probes), timeout=grace_s)


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
            shutdown()
