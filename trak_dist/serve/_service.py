"""Start and stop the service on the Ray cluster this process is connected to."""

from __future__ import annotations

import logging
import socket
from pathlib import Path

from trak_dist.config import LOOPBACK, JobConfig, ServeConfig
from trak_dist.distributed import keep_sigterm
from trak_dist.errors import ConfigError, StoreStateError
from trak_dist.pipeline import resolve_inputs
from trak_dist.remote import is_url
from trak_dist.sources import checkpoint_paths
from trak_dist.store import FeatureStore, file_fingerprint

APP_NAME = "trak_dist"


def read_token(sv: ServeConfig) -> str | None:
    """The bearer token from ``serve.token_file`` (None on loopback without one).

    Raises:
        ConfigError: the file is missing, unreadable or empty, or a token is required
            (``serve.require_token``, or a host beyond loopback) and no file is given.
    """
    if not sv.token_file:
        if sv.require_token or sv.host not in LOOPBACK:
            raise ConfigError(
                f"serve.host={sv.host} (require_token={sv.require_token}) needs a bearer token: "
                "set serve.token_file to a file holding one."
            )
        return None
    path = Path(sv.token_file)
    try:
        token = path.read_text().strip()
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(
            f"serve.token_file={path} cannot be read ({e}); write the token into it, e.g. "
            "`python -c 'import secrets; print(secrets.token_urlsafe(32))' > token`."
        ) from e
    if len(token) < 16 or any(c.isspace() for c in token):
        raise ConfigError(
            f"serve.token_file={path} holds {len(token)} characters; expected one token of at "
            "least 16 characters without spaces (e.g. secrets.token_urlsafe(32))."
        )
    return token


def check_servable(cfg: JobConfig) -> None:
    """Cheap checks before any replica starts, so that a store that cannot be served is one
    line here rather than a replica failing (and being retried) on the cluster.

    Raises:
        StoreStateError: no store, or a checkpoint's train features are incomplete.
        StoreMismatchError: a checkpoint file is not the one the store's rows come from.
    """
    if not is_url(cfg.store.path) and not Path(cfg.store.path).exists():
        raise StoreStateError(
            f"no store at {cfg.store.path}: run the batch job first (`trak-dist` with the same "
            "overrides), then `trak-dist serve`."
        )
    store = FeatureStore.open(cfg.store.path, mode="r", options=cfg.store.options)
    for c, path in enumerate(checkpoint_paths(cfg.model.checkpoints)):
        rows = store.train_rows(c)
        if not rows.is_complete():
            raise StoreStateError(
                f"model_id={c}: the train features in {store.where} are incomplete; run the "
                "batch job (`trak-dist` with the same overrides) to finish them first."
            )
        rows.binding.check(file_fingerprint(path), f"model_id={c}", store.where)


def url_of(sv: ServeConfig) -> str:
    host = socket.gethostname() if sv.host in ("0.0.0.0", "::") else sv.host
    host = f"[{host}]" if ":" in host else host
    return f"http://{host}:{sv.port}/"


def start(cfg: JobConfig) -> str:
    """Deploy the service for ``cfg`` on the connected Ray cluster (started in-process if
    none is); returns its URL once every replica answers.

    Raises:
        ConfigError, StoreStateError, StoreMismatchError: see ``read_token``, ``check_servable``.
    """
    import ray
    from ray import serve

    from trak_dist.serve._app import AttributionService

    sv = cfg.serve
    if sv.ann:  # the replicas build the index: a missing faiss is said before any starts
        from trak_dist.serve._ann import require_faiss

        require_faiss()
    cfg = resolve_inputs(cfg)  # the replicas load the job's model and text files
    token = read_token(sv)
    check_servable(cfg)
    if not ray.is_initialized():
        # SIGTERM (docker stop, systemd, kill) stays the program's: the service stops as on
        # Ctrl-C (serve's CLI), where Ray's handler would abort it and leave Serve's actors
        with keep_sigterm():
            if cfg.cluster.kind in ("local", "inprocess"):
                ray.init(address="local", include_dashboard=False, logging_level=logging.ERROR)
            else:
                ray.init(address=cfg.cluster.address or "auto", logging_level=logging.ERROR)
    serve.start(http_options={"host": sv.host, "port": sv.port})
    app = AttributionService.options(  # type: ignore[attr-defined]
        num_replicas=sv.num_replicas,
        # Serve's default (5 in flight per replica) would cap a batch at 5 requests
        max_ongoing_requests=2 * sv.max_batch_size,
        ray_actor_options={"num_cpus": sv.cpus_per_replica, "num_gpus": sv.gpus_per_replica},
    ).bind(cfg, token)
    serve.run(app, name=APP_NAME, route_prefix="/")
    return url_of(sv)


def stop() -> None:
    """Remove the service and shut Serve down (the Ray cluster stays)."""
    from ray import serve

    serve.shutdown()
