"""trak-dist's Hydra configs composed from overrides into a validated JobConfig (no Hydra app)."""

from __future__ import annotations

from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from trak_dist.cli import conf_dir  # also registers the structured schema
from trak_dist.config import JobConfig
from trak_dist.errors import ConfigError


def job_config(overrides: list[str]) -> JobConfig:
    """The JobConfig ``trak-dist <overrides>`` would run."""
    with initialize_config_dir(config_dir=str(conf_dir()), version_base=None):
        cfg = compose("config", overrides=overrides)
    job = OmegaConf.to_object(cfg)
    if not isinstance(job, JobConfig):
        raise ConfigError(f"the composed config is a {type(job).__name__}, not a JobConfig.")
    return job
