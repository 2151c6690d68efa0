"""trak-dist's Hydra configs: where they are, their structured schema, and overrides composed
into a validated JobConfig without a Hydra app (so nothing imports the CLI module,
docs/design.md, "Import rules"). Importing it registers the schema with Hydra's ConfigStore."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from hydra import compose, initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from trak_dist import _resources
from trak_dist.config import JobConfig
from trak_dist.errors import ConfigError


def _unfreeze(node: Any) -> Any:
    # OmegaConf makes frozen dataclasses read-only, which forbids Hydra's overrides; the frozen
    # class is still what OmegaConf.to_object builds (and validates) at the end.
    OmegaConf.set_readonly(node, False)
    if isinstance(node, DictConfig):
        for key in node:
            child = node._get_node(key)
            if isinstance(child, DictConfig):
                _unfreeze(child)
    return node


ConfigStore.instance().store(
    name="trak_dist_schema", node=_unfreeze(OmegaConf.structured(JobConfig))
)


def conf_dir() -> Path:
    """trak-dist's Hydra configs: ``$TRAK_DIST_CONF`` if set, else the installed
    ``trak_dist/conf``, else the checkout's ``conf/`` (ConfigError, in one line: no
    ``config.yaml`` there, or invalid YAML)."""
    env = os.environ.get("TRAK_DIST_CONF")
    if env:
        path = Path(env)
        if not (path / "config.yaml").is_file():
            raise ConfigError(
                f"TRAK_DIST_CONF={env}, but {path / 'config.yaml'} does not exist. Point it at a "
                "copy of the repository's conf/, or unset it to use the configs installed with "
                "trak_dist."
            )
    else:
        found = _resources.find("conf", "config.yaml")
        if found is None:
            searched = " and ".join(str(p) for p in _resources.candidates("conf"))
            raise ConfigError(
                f"trak-dist's Hydra configs were not found: no config.yaml in {searched}. "
                "Reinstall trak_dist (pip install from a clone or from a wheel), or set "
                "TRAK_DIST_CONF to a copy of the repository's conf/."
            )
        path = found
    for file in sorted(path.rglob("*.yaml")):
        try:
            yaml.safe_load(file.read_text())
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
            raise ConfigError(
                f"the Hydra config {file} cannot be read: {_why(e)}. Fix or restore it (the "
                "repository's conf/ has the originals), or set TRAK_DIST_CONF to a working copy."
            ) from e
    return path


def _why(e: Exception) -> str:
    if isinstance(e, yaml.MarkedYAMLError) and e.problem_mark is not None:
        mark = e.problem_mark
        return f"{e.problem} (line {mark.line + 1}, column {mark.column + 1})"
    return " ".join(str(e).split())


def compose_job(overrides: Sequence[str]) -> JobConfig:
    """The JobConfig ``trak-dist <overrides>`` would run, composed without a Hydra app
    (ConfigError: an override Hydra or the schema refuses, or configs not found or unreadable)."""
    try:
        with initialize_config_dir(config_dir=str(conf_dir()), version_base=None):
            cfg = compose("config", overrides=list(overrides))
        job = OmegaConf.to_object(cfg)
    except (HydraException, OmegaConfBaseException) as e:
        raise ConfigError(f"bad override in {list(overrides)}: {str(e).splitlines()[0]}") from e
    if not isinstance(job, JobConfig):
        raise ConfigError(f"the composed config is a {type(job).__name__}, not a JobConfig.")
    return job
