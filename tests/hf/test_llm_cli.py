"""``Attribute your LLM``: the README's command on tiny Llama and GPT-2 checkpoint directories
equals the traker-style Python API on the same tokenised batches."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import trak_dist
from tests.fixtures import llm_models
from tests.fixtures.helpers import one_thread
from trak_dist import TRAKer
from trak_dist.config import (
    DataConfig,
    FeaturizeConfig,
    JobConfig,
    ModelConfig,
    ProjectionConfig,
    TaskConfig,
)
from trak_dist.hf import from_checkpoints, load_state
from trak_dist.pipeline import resolve_inputs
from trak_dist.sources import batch_of
from trak_dist.store import FeatureStore

README = Path(__file__).resolve().parents[2] / "README.md"
CLI = [sys.executable, "-c", "from trak_dist.cli import main; main()"]
# projection/curvature pinned (dense, XᵀX) at both doors, as in TRAKer's traker-style runs here;
# their common causal_lm default, Kronecker + the sampled-label Fisher (tasks/_defaults.py), is
# compared in tests/test_traker_defaults.py
PINS = ["proj_dim=16", "projection=rademacher", "featurize.curvature=xtx", "progress=false"]
SMALL = [*PINS, "cluster=local", "cluster.num_workers=1"]
# what is checked is the model side (adapters, dtypes), not the executor: no Ray (~20 s less)
IN_PROCESS = [*PINS, "cluster=inprocess"]


def readme_commands() -> list[list[str]]:
    """The ``trak-dist … model=hf`` lines of the README's "Attribute your LLM" section."""
    text = README.read_text()
    section = text[text.index("## Attribute your LLM") :]
    section = section[: section.index("\n## ", 1)]
    lines = re.findall(r"^trak-dist .*model=hf.*$", section, flags=re.M)
    return [shlex.split(line)[1:] for line in lines]


def run_cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(RAY_USAGE_STATS_ENABLED="0")
    return subprocess.run(
        [*CLI, *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=600
    )


def api_scores(root: Path, ckpts: list[Path], dtype: str = "float32") -> np.ndarray:
    """TRAKer on the batches ``data=text`` builds, checkpoint by checkpoint."""
    cfg = resolve_inputs(
        JobConfig(
            model=ModelConfig(factory="hf", checkpoints=[str(c) for c in ckpts], dtype=dtype),
            data=DataConfig(
                format="text", train=str(root / "train.jsonl"), targets=str(root / "targets.jsonl")
            ),
            task=TaskConfig(name="causal_lm"),
        )
    )
    train, targets = cfg.data.train(), cfg.data.targets()
    # as a Ray worker with cpus_per_worker=1 computes: one thread (another thread count sums
    # matmuls in another order, which moves near-zero scores by ~1e-7 of the largest)
    with one_thread():
        return _traker_scores(root, ckpts, dtype, train, targets)


def _traker_scores(root: Path, ckpts: list[Path], dtype: str, train, targets) -> np.ndarray:
    traker = TRAKer(
        model=from_checkpoints(ckpts, dtype),
        task="causal_lm",
        train_set_size=len(train),
        save_dir=root / "api.zarr",
        device="cpu",
        proj_dim=16,
        projection="rademacher",  # PINS
        curvature="xtx",
    )
    for i, c in enumerate(ckpts):
        traker.load_checkpoint(load_state(c), model_id=i)
        traker.featurize(batch=batch_of(train, 0, len(train)), num_samples=len(train))
    traker.finalize_features()
    for i, c in enumerate(ckpts):
        traker.start_scoring_checkpoint(
            exp_name="t", checkpoint=load_state(c), model_id=i, num_targets=len(targets)
        )
        traker.score(batch=batch_of(targets, 0, len(targets)), num_samples=len(targets))
    return np.asarray(traker.finalize_scores(exp_name="t"))


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_readme_command_equals_the_python_api(tmp_path, arch):
    ckpts = llm_models.checkpoints(tmp_path, arch)
    attribute, show = readme_commands()
    out = run_cli([*attribute, *SMALL, "hydra.run.dir=run"], tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads((tmp_path / "run" / "trak_report.json").read_text())
    assert report["rows_computed"] == {"train": 3 * 40, "target": 3 * 6}
    store = FeatureStore.open(tmp_path / "trak_store.zarr", mode="r")
    sset = store.score_set("targets", report["variants"][0]["variant"])
    cli = sset.scores()
    assert cli.shape == (40, 6)
    expected = api_scores(tmp_path, ckpts)
    np.testing.assert_allclose(cli, expected, rtol=1e-5, atol=1e-6 * np.abs(expected).max())
    # the run report names targets and proponents by their text
    first = report["variants"][0]["examples"][0]
    prompt = llm_models.targets()[0]
    assert first["target_text"] == prompt["prompt"] + prompt["completion"]
    assert first["proponent_texts"][0] == llm_models.sentences(40)[first["proponents"][0]]
    assert f"**target 0**: `{first['target_text']}`" in out.stdout
    # the README's show command prints the same top proponent, as text
    shown = run_cli([*show, *SMALL, "show.json=true", "show.k=1"], tmp_path)
    assert shown.returncode == 0, shown.stderr[-3000:]
    rows = json.loads(shown.stdout)
    train_text = [
        json.loads(x)["text"] for x in (tmp_path / "train.jsonl").read_text().split("\n") if x
    ]
    for t, row in enumerate(rows):
        top = int(np.argmax(cli[:, t]))
        assert row["proponents"][0]["index"] == top
        assert row["proponents"][0]["text"] == train_text[top]
        assert row["proponents"][0]["score"] == pytest.approx(float(cli[top, t]), rel=1e-5)


@pytest.mark.slow
@pytest.mark.ray
def test_lora_adapters_are_attributed_wrt_their_trainable_parameters(tmp_path):
    base = llm_models.checkpoints(tmp_path, "llama", num=1)[0]
    adapters = llm_models.adapters(tmp_path, base)
    model = from_checkpoints(adapters)
    names = [n for n, _ in model.named_parameters()]
    assert names and all(".lora_A." in n or ".lora_B." in n for n in names)
    d = sum(p.numel() for p in model.parameters())
    args = [
        "task=causal_lm",
        "model=hf",
        "data=text",
        "model.checkpoints=[lora0,lora1]",
        "data.train=train.jsonl",
        "data.targets=targets.jsonl",
        "hydra.run.dir=run",
    ]
    out = run_cli([*args, *IN_PROCESS], tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    store = FeatureStore.open(tmp_path / "trak_store.zarr", mode="r")
    assert store.spec.grad_dim == d  # the adapter's parameters, not the base model's
    report = json.loads((tmp_path / "run" / "trak_report.json").read_text())
    cli = store.score_set("targets", report["variants"][0]["variant"]).scores()
    expected = api_scores(tmp_path, adapters)
    # the rows are stored in float16: the CLI's length-grouped micro-batches and the API's one
    # batch can round one entry of a target's row apart (seen: 3.8e-6 in one row of 6, with
    # transformers 5.24), which moves that target's scores by ~1e-5 of the largest
    np.testing.assert_allclose(cli, expected, rtol=1e-5, atol=2e-5 * np.abs(expected).max())


@pytest.mark.slow
@pytest.mark.ray
def test_bfloat16_weights(tmp_path):
    ckpts = llm_models.checkpoints(tmp_path, "llama", num=2, dtype=torch.bfloat16)
    assert from_checkpoints(ckpts, "bfloat16").lm_head.weight.dtype == torch.bfloat16
    args = [
        "task=causal_lm",
        "model=hf",
        "data=text",
        "model.checkpoints=[c0,c1]",
        "model.dtype=bfloat16",
        "data.train=train.jsonl",
        "data.targets=targets.jsonl",
        "hydra.run.dir=run",
    ]
    out = run_cli([*args, *IN_PROCESS], tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    store = FeatureStore.open(tmp_path / "trak_store.zarr", mode="r")
    report = json.loads((tmp_path / "run" / "trak_report.json").read_text())
    cli = store.score_set("targets", report["variants"][0]["variant"]).scores()
    assert np.isfinite(cli).all() and np.abs(cli).max() > 0
    expected = api_scores(tmp_path, ckpts, "bfloat16")
    np.testing.assert_allclose(cli, expected, rtol=1e-5, atol=1e-6 * np.abs(expected).max())


@pytest.mark.slow
@pytest.mark.ray
def test_python_run_takes_the_same_directories_and_files(ray_session, tmp_path, monkeypatch):
    ckpts = llm_models.checkpoints(tmp_path, "gpt2", num=2)
    monkeypatch.chdir(tmp_path)
    result = trak_dist.run(
        model="hf",
        checkpoints=[c.name for c in ckpts],
        train="train.jsonl",
        targets="targets.jsonl",
        task="causal_lm",
        store="run.zarr",
        proj_dim=16,
        num_workers=1,
        progress=False,
        report=None,
        # TRAKer's projection and curvature (causal_lm's default is Kronecker + Fisher)
        projection=ProjectionConfig(kind="rademacher"),
        featurize=FeaturizeConfig(curvature="xtx"),
    )
    expected = api_scores(tmp_path, ckpts)
    scores = result.scores()
    np.testing.assert_allclose(scores, expected, rtol=1e-5, atol=1e-6 * np.abs(expected).max())
