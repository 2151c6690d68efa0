"""``model.checkpoints`` names on the Hugging Face Hub (``org/name@revision``), offline: a cache
written in huggingface_hub's layout (``tests/fixtures/hub_cache.py``) with two branches, read by
the library's own API first, then by trak_dist's resolver and a causal-LM job from the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.fixtures import hub_cache, llm_models
from trak_dist.config import DataConfig, JobConfig, ModelConfig, TaskConfig
from trak_dist.errors import ConfigError
from trak_dist.hf import absolute, expand, is_hub_name, pin, resolve
from trak_dist.pipeline import resolve_inputs
from trak_dist.sources import checkpoint_paths, node_checkpoints
from trak_dist.store import FeatureStore, file_fingerprint

REPO = "tiny-org/tiny-gpt2"
CLI = [sys.executable, "-c", "from trak_dist.cli import main; main()"]
JOB = [
    "task=causal_lm",
    "model=hf",
    "data=text",
    "proj_dim=16",
    "lambda_reg=0.01",
    "projection=rademacher",
    "featurize.curvature=xtx",
    "cluster=inprocess",
    "progress=false",
    "data.train=train.jsonl",
    "data.targets=targets.jsonl",
]


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> tuple[Path, list[Path]]:
    """Three tiny GPT-2 checkpoint directories (each a few more steps of training) and the
    train / target JSONL files beside them."""
    root = tmp_path_factory.mktemp("models")
    return root, llm_models.checkpoints(root, "gpt2", num=3, n_train=24, steps=5)


@pytest.fixture
def hub(models, tmp_path, monkeypatch) -> dict:
    """A cache with ``REPO``'s branches step1 (c0) and step2 (c1), and c2 as a commit no branch
    names yet; this process and its children offline on it."""
    root, ckpts = models
    cache = tmp_path / "hub"
    commits = {
        "step1": hub_cache.add_commit(cache, REPO, ckpts[0], "step1"),
        "step2": hub_cache.add_commit(cache, REPO, ckpts[1], "step2"),
        "later": hub_cache.add_commit(cache, REPO, ckpts[2]),
    }
    env = hub_cache.offline(monkeypatch, cache)
    return {"cache": cache, "commits": commits, "env": env, "root": root, "ckpts": ckpts}


def test_the_cache_is_one_huggingface_hub_and_transformers_read(hub):
    from huggingface_hub import snapshot_download
    from transformers import AutoConfig

    for branch, commit in hub["commits"].items():
        if branch == "later":
            continue
        folder = snapshot_download(
            REPO, revision=branch, cache_dir=hub["cache"], local_files_only=True
        )
        assert (
            Path(folder)
            == hub["cache"] / f"models--{REPO.replace('/', '--')}" / "snapshots" / commit
        )
        config = AutoConfig.from_pretrained(
            REPO, revision=branch, cache_dir=hub["cache"], local_files_only=True
        )
        assert config.model_type == "gpt2"


def test_the_resolver_gives_huggingface_hubs_snapshots_and_commits(hub):
    from huggingface_hub import snapshot_download

    for branch in ("step1", "step2"):
        snap = resolve(f"{REPO}@{branch}")
        folder = snapshot_download(
            REPO, revision=branch, cache_dir=hub["cache"], local_files_only=True
        )
        assert snap.path == Path(folder)
        assert snap.commit == hub["commits"][branch] == Path(folder).name
        assert snap.pinned == f"{REPO}@{snap.commit}"
        assert resolve(snap.pinned).path == snap.path  # a pinned name is its own snapshot
    # the snapshot holds the same files as the directory it was made from
    step1 = resolve(f"{REPO}@step1").path
    assert file_fingerprint(step1) == file_fingerprint(hub["ckpts"][0])
    # mixed with a local directory; in order
    assert expand([f"{REPO}@step2", str(hub["ckpts"][2])]) == [
        resolve(f"{REPO}@step2").path,
        hub["ckpts"][2].resolve(),
    ]
    assert absolute([f"{REPO}@step1"]) == [f"{REPO}@{hub['commits']['step1']}"]
    assert pin([f"{REPO}@step1", "c0"]) == [f"{REPO}@{hub['commits']['step1']}", "c0"]


def test_a_local_path_that_exists_wins_over_a_hub_name(hub, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert is_hub_name(f"{REPO}@step1") and is_hub_name(REPO)
    local = tmp_path / REPO
    local.mkdir(parents=True)
    assert not is_hub_name(REPO)  # ./tiny-org/tiny-gpt2 exists
    assert not is_hub_name(Path("a/b"))  # a Path is a path
    for path in ("./a/b", "../a/b", "/a/b", "a/b/c", "s3://a/b", "a/*", "ckpts/c0.pt"):
        assert not is_hub_name(path), path
    # a missing state-dict file is still said to be one, with no Hub look-up
    with pytest.raises(ConfigError, match="checkpoint files not found"):
        checkpoint_paths(["ckpts/c0.pt"])


def test_driver_pins_every_node_to_the_commit(hub):
    root, ckpts = hub["root"], hub["ckpts"]
    cfg = resolve_inputs(
        JobConfig(
            model=ModelConfig(factory="hf", checkpoints=[f"{REPO}@step1", str(ckpts[1])]),
            data=DataConfig(
                format="text", train=str(root / "train.jsonl"), targets=str(root / "targets.jsonl")
            ),
            task=TaskConfig(name="causal_lm"),
        )
    )
    pinned = f"{REPO}@{hub['commits']['step1']}"
    assert cfg.model.checkpoints == [pinned, str(ckpts[1])]
    assert cfg.model.kwargs["checkpoints"] == [pinned, str(ckpts[1].resolve())]
    # the branch moves after the driver resolved it: the job still loads step1's commit
    hub_cache.move_ref(hub["cache"], REPO, "step1", hub["commits"]["later"])
    assert checkpoint_paths(cfg.model.checkpoints)[0] == resolve(pinned).path
    # a node without the driver's snapshot path loads the pinned commit from its own cache
    elsewhere = [Path("/elsewhere/snapshots") / hub["commits"]["step1"], ckpts[1].resolve()]
    here = node_checkpoints(cfg.model.checkpoints, elsewhere)
    assert here == [resolve(pinned).path, ckpts[1].resolve()]
    assert resolve_inputs(cfg).model.checkpoints == [pinned, str(ckpts[1])]  # idempotent


def test_a_revision_missing_offline_is_one_clear_error(hub):
    with pytest.raises(ConfigError) as err:
        checkpoint_paths([f"{REPO}@step1", f"{REPO}@step9"])
    msg = str(err.value)
    assert f"model.checkpoints='{REPO}@step9'" in msg
    assert "HF_HUB_OFFLINE" in msg and str(hub["cache"]) in msg
    assert f"hf download {REPO} --revision step9" in msg
    with pytest.raises(ConfigError, match="not in the Hugging Face cache"):
        resolve("other-org/absent")


def run_cli(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | env
    return subprocess.run(
        [*CLI, *args], capture_output=True, text=True, cwd=cwd, env=full, timeout=300
    )


def scores(store: Path, run: Path) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    report = json.loads((run / "trak_report.json").read_text())
    sset = FeatureStore.open(store, mode="r").score_set("targets", report["variants"][0]["variant"])
    return sset.scores(), sset.read_topk()


@pytest.mark.slow
def test_a_job_on_hub_names_equals_the_same_snapshots_as_directories_and_a_moved_branch_is_refused(
    hub,
):
    root, ckpts = hub["root"], hub["ckpts"]
    names = f"model.checkpoints=[{REPO}@step1,{REPO}@step2]"
    out = run_cli([*JOB, names, "store.path=hub.zarr", "hydra.run.dir=run_hub"], root, hub["env"])
    assert out.returncode == 0, out.stderr[-3000:]
    dirs = f"model.checkpoints=[{ckpts[0]},{ckpts[1]}]"
    out = run_cli([*JOB, dirs, "store.path=dirs.zarr", "hydra.run.dir=run_dirs"], root, hub["env"])
    assert out.returncode == 0, out.stderr[-3000:]
    s_hub, top_hub = scores(root / "hub.zarr", root / "run_hub")
    s_dirs, top_dirs = scores(root / "dirs.zarr", root / "run_dirs")
    assert s_hub.shape == (24, 6) and np.abs(s_hub).max() > 0
    np.testing.assert_array_equal(s_hub, s_dirs)
    for key in top_dirs:
        np.testing.assert_array_equal(top_hub[key], top_dirs[key])

    # step2 pushed to other weights: the same names are another checkpoint, not reused features
    hub_cache.move_ref(hub["cache"], REPO, "step2", hub["commits"]["later"])
    out = run_cli([*JOB, names, "store.path=hub.zarr", "hydra.run.dir=run_moved"], root, hub["env"])
    assert out.returncode != 0
    later = resolve(f"{REPO}@{hub['commits']['later']}").path
    assert f"model_id=1 ({later}) in " in out.stderr, out.stderr[-3000:]
    assert "was featurised from a different checkpoint" in out.stderr


def test_an_adapter_and_its_base_named_on_the_hub_build_the_local_adapter(tmp_path, monkeypatch):
    import torch

    from trak_dist.hf import from_checkpoints

    base = llm_models.checkpoints(tmp_path, "llama", num=1, n_train=12, steps=2)[0]
    lora = llm_models.adapters(tmp_path, base, num=1)[0]
    # as an adapter trained on the Hub's copy of its base records it
    config = json.loads((lora / "adapter_config.json").read_text())
    hub_lora = tmp_path / "hub_lora"
    hub_lora.mkdir()
    for f in lora.iterdir():
        (hub_lora / f.name).write_bytes(f.read_bytes())
    config["base_model_name_or_path"] = "tiny-org/tiny-llama"
    (hub_lora / "adapter_config.json").write_text(json.dumps(config))
    cache = tmp_path / "hub"
    base_commit = hub_cache.add_commit(cache, "tiny-org/tiny-llama", base, "main")
    hub_cache.add_commit(cache, "tiny-org/tiny-lora", hub_lora, "step1")
    hub_cache.offline(monkeypatch, cache)
    cfg = resolve_inputs(
        JobConfig(
            model=ModelConfig(factory="hf", checkpoints=["tiny-org/tiny-lora@step1"]),
            task=TaskConfig(name="causal_lm"),
        )
    )
    kwargs = cfg.model.kwargs
    assert kwargs["base"] == f"tiny-org/tiny-llama@{base_commit}"  # pinned like the adapter
    from_hub = from_checkpoints(kwargs["checkpoints"], base=kwargs["base"])
    local = from_checkpoints([str(lora)], base=str(base))
    hub_state, local_state = from_hub.state_dict(), local.state_dict()
    assert hub_state.keys() == local_state.keys()
    for name, value in local_state.items():
        torch.testing.assert_close(hub_state[name], value, rtol=0, atol=0)
