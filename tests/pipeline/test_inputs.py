"""Configuration is data; the resolve-inputs stage (``resolve_inputs``) is where it meets the
file system: Hugging Face directories and globs, text files, the store path."""

import dataclasses
import os

import pytest

from trak_dist.config import (
    HF_FACTORY,
    DataConfig,
    JobConfig,
    ModelConfig,
    StoreConfig,
    TaskConfig,
)
from trak_dist.errors import ConfigError
from trak_dist.pipeline import resolve_inputs


def hf_job(tmp_path, checkpoints) -> JobConfig:
    return JobConfig(
        model=ModelConfig(factory="hf", checkpoints=checkpoints),
        data=DataConfig(train=str(tmp_path / "t.jsonl"), targets=str(tmp_path / "u.jsonl")),
        task=TaskConfig(name="causal_lm"),
        store=StoreConfig(path="rel/store.zarr"),
    )


def test_a_config_reads_nothing_resolving_does(tmp_path, monkeypatch):
    """Building the config of a glob that matches nothing succeeds (no file is looked at);
    resolving it is the error, naming the glob."""
    monkeypatch.chdir(tmp_path)
    cfg = hf_job(tmp_path, str(tmp_path / "runs" / "checkpoint-*"))
    assert cfg.model.factory == "hf" and cfg.data.format == "text"  # as given: data only
    with pytest.raises(ConfigError, match=r"glob .*checkpoint-\*' matches nothing"):
        resolve_inputs(cfg)


def test_resolving_makes_paths_absolute_once_and_again_changes_nothing(tmp_path, monkeypatch):
    from trak_dist.hf import TextSource

    monkeypatch.chdir(tmp_path)
    for k in (1, 0):
        (tmp_path / "runs" / f"checkpoint-{k}").mkdir(parents=True)
    cfg = resolve_inputs(hf_job(tmp_path, "runs/checkpoint-*"))
    ckpts = [str(tmp_path / "runs" / f"checkpoint-{k}") for k in (0, 1)]
    assert cfg.model.factory == HF_FACTORY and cfg.model.kwargs["checkpoints"] == ckpts
    assert isinstance(cfg.data.train, TextSource) and cfg.data.train.checkpoints == ckpts
    assert cfg.store.path == str(tmp_path / "rel" / "store.zarr")
    assert resolve_inputs(cfg) == cfg
    # a new checkpoint list is resolved anew, not kept from the first resolution
    other = dataclasses.replace(cfg.model, checkpoints=[ckpts[1]])
    again = resolve_inputs(dataclasses.replace(cfg, model=other))
    assert again.model.kwargs["checkpoints"] == [ckpts[1]]
    assert os.path.isabs(again.store.path)
