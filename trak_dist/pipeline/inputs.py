"""Resolve inputs: the first stage of every run, the one place where a job's configuration
(data only) meets the file system; workers get what the driver resolved. ``model=hf``: the
Hugging Face factory with absolute checkpoint directories (globs expanded) and Hub names pinned
to their commits; ``data=text``: ``TextSource`` datasets; ``store.path``: absolute. Fetching
remote checkpoints or data into a local cache belongs here too: what comes out is read from
local paths."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

from trak_dist.config import HF_FACTORY, JobConfig, ModelConfig
from trak_dist.remote import is_url, local_path

logger = logging.getLogger(__name__)


def resolve_inputs(cfg: JobConfig) -> JobConfig:
    """``cfg`` with its model and data resolved (above); idempotent, so every entry point may
    call it (ConfigError: a path that does not exist, a bad combination)."""
    model = _resolve_model(cfg.model)
    data = cfg.data
    if data.format == "text":
        from trak_dist.hf import text_sources  # only text jobs need the hf extra

        data = text_sources(data, model, cfg.task.name)
    return absolute_store(dataclasses.replace(cfg, model=model, data=data))


def _resolve_model(model: ModelConfig) -> ModelConfig:
    if model.factory not in ("hf", HF_FACTORY):
        return model
    from trak_dist.hf import absolute, pin, pinned_base  # only model=hf needs the hf extra

    # Hub names pinned to their commits here, once: the workers (on any node) and every later
    # stage load the same bits, whatever the branch points to by then
    checkpoints = pin(model.checkpoints)
    # the factory builds the first checkpoint's architecture on every worker, so it needs the
    # checkpoints and options; derived from the fields each time (a replaced checkpoint list
    # must not keep the old one)
    options = {
        "checkpoints": absolute(checkpoints),
        "dtype": model.dtype,
        "base": pinned_base(checkpoints, model.base),
        "trust_remote_code": model.trust_remote_code,
    }
    return dataclasses.replace(
        model, checkpoints=checkpoints, factory=HF_FACTORY, kwargs={**model.kwargs, **options}
    )


def absolute_store(cfg: JobConfig) -> JobConfig:
    """Workers run in their own working directory (or on another node): ship absolute paths."""
    if is_url(cfg.store.path):
        return cfg
    path = Path(local_path(cfg.store.path))  # file:///abs/store.zarr is a directory too
    if not path.is_absolute() and cfg.cluster.kind not in ("local", "inprocess"):
        logger.warning(
            "store.path=%s is relative: it resolves to %s on the driver's machine (under `ray "
            "job submit`, the job's temporary directory). Give a shared absolute path.",
            path,
            path.resolve(),
        )
    store = dataclasses.replace(cfg.store, path=str(path.resolve()))
    return dataclasses.replace(cfg, store=store)
