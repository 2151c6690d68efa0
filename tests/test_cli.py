"""The `trak-dist` Hydra app, run as a user runs it."""

import json
import os
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import numpy as np
import pytest
import zarr

from tests.fixtures.helpers import spec_of
from trak_dist._compose import compose_job
from trak_dist.cli import sweep_width
from trak_dist.scoring import resolve_kinv_scaling
from trak_dist.store._spec import FORMAT_VERSION
from trak_dist.tasks import (
    CausalLM,
    TaskDefaults,
    resolve_curvature,
    resolve_task,
    task_defaults,
)

CLI = [sys.executable, "-c", "from trak_dist.cli import main; main()"]
# the CLI in a process where importing Ray fails (the GPU check machine has no Ray at all)
NO_RAY = [
    sys.executable,
    "-c",
    "import sys; sys.modules['ray'] = None\nfrom trak_dist.cli import main; main()",
]


def trak_dist(args, cwd, timeout=300, cli=CLI):
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(TRAK_DIST_CACHE=str(Path(cwd) / "cache"), RAY_USAGE_STATS_ENABLED="0")
    return subprocess.run(
        [*cli, *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=timeout
    )


def test_help_lists_the_config_groups(tmp_path):
    out = trak_dist(["--help"], tmp_path)
    assert out.returncode == 0
    for line in (
        "cluster: inprocess, local, ray, slurm",
        "projection: auto, identity, kronecker, normal, rademacher",
        "task: causal_lm, image_classification, text_classification",
        "data: custom, digits, text",
        "model: custom, digits_mlp, hf",
    ):
        assert line in out.stdout


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("proj_dim=0", "JobConfig.proj_dim=0; expected a positive integer"),
        ("store.codec=lz9", "StoreConfig.codec='lz9'; expected one of"),
        ("featurize.shard_rows=100", "featurize.shard_rows=100 is not a multiple of store.chunk"),
        ("model.factory=nowhere:make", "model.factory='nowhere:make' could not be imported"),
        ("cluster=ray", "cluster=ray joins a running Ray cluster, but neither cluster.address"),
        ("featurize.gradient_engine=jax", "FeaturizeConfig.gradient_engine='jax'; expected one"),
        ("lambda_reg=nan", "lambda_reg=nan; expected 'auto' or a finite number ≥ 0"),
        ("lambda_reg=-1", "lambda_reg=-1.0; expected 'auto' or a finite number ≥ 0"),
        ("lambda_reg=often", "lambda_reg='often'; expected 'auto' or a finite number ≥ 0"),
        ("scoring.write_scores=half", "ScoringConfig.write_scores='half'; expected one of"),
        ("scoring.memory=lots", "scoring.memory='lots'; expected bytes as an integer or with"),
    ],
)
def test_bad_values_get_one_clear_line_and_exit_2(tmp_path, override, message):
    out = trak_dist([override, "progress=false"], tmp_path)
    assert out.returncode == 2
    assert f"trak-dist: error: {message}" in out.stderr
    assert "Traceback" not in out.stderr


def test_sweeps_featurise_at_the_largest_proj_dim():
    argv = ["trak-dist", "-m", "proj_dim=512,2048,1024", "lambda_reg=0,1"]
    assert sweep_width(argv) == [*argv, "projection.featurize_dim=2048"]
    assert sweep_width(["trak-dist", "proj_dim=512"]) == ["trak-dist", "proj_dim=512"]
    given = ["trak-dist", "-m", "proj_dim=8,16", "projection.featurize_dim=64"]
    assert sweep_width(given) == given
    ranged = ["trak-dist", "--multirun", "proj_dim=range(32,129,32)"]
    assert sweep_width(ranged)[-1] == "projection.featurize_dim=128"
    auto = ["trak-dist", "-m", "proj_dim=auto,4096"]
    assert sweep_width(auto) == auto


def auto_scaling(cfg) -> str:  # type: ignore[no-untyped-def]
    """What ``kinv_scaling=auto`` becomes for the store ``cfg`` would write (task, curvature)."""
    task = resolve_task(cfg.task.name)
    spec = spec_of(cfg.task.name, resolve_curvature(cfg.featurize.curvature, task), 8, 4)
    return resolve_kinv_scaling(cfg.scoring.kinv_scaling, spec)


def test_per_task_defaults_leave_the_digits_default_job_as_it_was():
    """``proj_dim=auto`` / ``projection=auto`` / ``featurize.curvature=auto`` /
    ``scoring.kinv_scaling=auto``: the default (digits) job is the very JobConfig of the former
    explicit defaults, p = 512 dense Rademacher with XᵀX and traker's mean_abs, so its features
    and scores are unchanged; causal LMs get Kronecker p = 2048 with the sampled-label Fisher
    and per-target checkpoint weights (benchmarks/RESULTS.md, "Causal LMs"); explicit choices
    win."""
    default = compose_job([])
    assert default == compose_job(["proj_dim=512", "projection=rademacher"])
    assert (default.proj_dim, default.projection.kind) == (512, "rademacher")
    # kinv_scaling=auto is resolved where scores are made, from the store's task and curvature
    assert default.scoring.kinv_scaling == "auto"
    assert auto_scaling(default) == "mean_abs"
    digits = resolve_task(default.task.name)
    assert resolve_curvature(default.featurize.curvature, digits) == "xtx"
    text = compose_job(["task=text_classification"])
    assert (text.proj_dim, text.projection.kind) == (512, "rademacher")
    assert resolve_curvature(text.featurize.curvature, resolve_task(text.task.name)) == "xtx"
    lm = compose_job(["task=causal_lm"])
    assert (lm.proj_dim, lm.projection.kind) == (2048, "kronecker")
    assert resolve_curvature(lm.featurize.curvature, resolve_task(lm.task.name)) == "fisher"
    assert auto_scaling(lm) == "per_target"
    # per_target goes with the Fisher: a causal LM with XᵀX keeps traker's weights
    xtx = compose_job(["task=causal_lm", "featurize.curvature=xtx"])
    assert auto_scaling(xtx) == "mean_abs"
    chosen = compose_job(["task=causal_lm", "proj_dim=512", "projection=rademacher"])
    assert (chosen.proj_dim, chosen.projection.kind) == (512, "rademacher")
    by_path = task_defaults("trak_dist.tasks:CausalLM")
    assert (by_path, task_defaults(CausalLM()), task_defaults("image_classification")) == (
        TaskDefaults(2048, "kronecker", "fisher"),
        TaskDefaults(2048, "kronecker", "fisher"),
        TaskDefaults(512, "rademacher", "xtx"),
    )
    # TRAKer's other tasks keep traker's p = 2048 (docs/traker.md); its causal LMs are the job's
    assert task_defaults("image_classification", traker=True).proj_dim == 2048
    assert task_defaults("causal_lm", traker=True) == task_defaults("causal_lm")


@pytest.mark.slow
@pytest.mark.ray
def test_embedded_default_then_new_targets_reuse_the_train_features(tmp_path):
    first = trak_dist(["hydra.run.dir=run1", "progress=false"], tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "Top-k proponents sharing their target's label" in first.stdout
    report = json.loads((tmp_path / "run1" / "trak_report.json").read_text())
    assert report["rows_computed"] == {"train": 3 * 1500, "target": 3 * 297}
    assert report["trak_dist_version"] == version("trak_dist")
    assert report["store_format_version"] == FORMAT_VERSION
    assert (tmp_path / "trak_store.zarr").is_dir()
    # digits are images: the report links a picture of targets beside their proponents
    assert report["figure"] == "trak_report.png"
    assert (tmp_path / "run1" / "trak_report.png").stat().st_size > 10_000
    assert "](trak_report.png)" in (tmp_path / "run1" / "trak_report.md").read_text()
    # score a new target set (the train set itself) against the existing store
    second = trak_dist(
        [
            "hydra.run.dir=run2",
            "progress=false",
            "scoring.exp_name=train_as_targets",
            "data.targets=trak_dist.examples.digits:train_set",
        ],
        tmp_path,
    )
    assert second.returncode == 0, second.stderr[-3000:]
    report = json.loads((tmp_path / "run2" / "trak_report.json").read_text())
    assert report["rows_computed"] == {"train": 0, "target": 3 * 1500}
    # a digit's own image is its strongest proponent far more often than chance
    variant = report["variants"][0]
    assert variant["proponent_label_agreement"] > 0.2


@pytest.mark.slow
@pytest.mark.ray
def test_cluster_inprocess_runs_without_ray_and_gives_the_ray_job_s_bits(
    tmp_path, digits_checkpoints
):
    """``cluster=inprocess`` runs every stage in the CLI's process, Ray unimportable there, and
    writes the S and top-k of the same job on a local Ray, bit for bit."""
    ckpts = ",".join(str(c) for c in digits_checkpoints)
    common = ["progress=false", "report=null", f"model.checkpoints=[{ckpts}]", "proj_dim=128"]
    on_ray = trak_dist(["hydra.run.dir=r1", "store.path=ray.zarr", *common], tmp_path)
    assert on_ray.returncode == 0, on_ray.stderr[-3000:]
    here = ["hydra.run.dir=r2", "store.path=here.zarr", "cluster=inprocess", *common]
    out = trak_dist(here, tmp_path, cli=NO_RAY)
    assert out.returncode == 0, out.stderr[-3000:]
    blocked = trak_dist(["hydra.run.dir=r3", "store.path=ray.zarr", *common], tmp_path, cli=NO_RAY)
    assert blocked.returncode != 0  # the check itself: this process cannot import Ray
    for name in ("S", "proponents_idx", "proponents_val", "opponents_idx", "opponents_val"):
        node = f"scores/targets/p128_lambdaauto/{name}"
        ours = zarr.open_array(str(tmp_path / "here.zarr" / node), mode="r")[:]
        np.testing.assert_array_equal(ours, zarr.open_array(str(tmp_path / "ray.zarr" / node))[:])


def test_store_subcommand_on_a_path_that_is_no_store(tmp_path):
    out = trak_dist(["store", "verify", str(tmp_path / "nothing.zarr")], tmp_path)
    assert out.returncode == 2
    assert out.stderr.startswith("trak-dist store: error: no trak_dist store at ")
    usage = trak_dist(["store", "--help"], tmp_path)
    assert usage.returncode == 0 and "verify" in usage.stdout and "repair" in usage.stdout


@pytest.mark.slow
def test_kronecker_projection_from_the_command_line(tmp_path, digits_checkpoints):
    ckpt = f"model.checkpoints=[{digits_checkpoints[0]}]"
    common = ["progress=false", ckpt, "proj_dim=64", "cluster=inprocess"]
    out = trak_dist(
        ["hydra.run.dir=run1", "projection=kronecker", "lambda_reg=1e-2", *common], tmp_path
    )
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads((tmp_path / "run1" / "trak_report.json").read_text())
    assert report["rows_computed"] == {"train": 1500, "target": 297}
    assert report["variants"][0]["proponent_label_agreement"] > 0.2
    # the store says it holds Kronecker features: asking for Rademacher ones is refused
    again = trak_dist(["hydra.run.dir=run2", "projection=rademacher", *common], tmp_path)
    assert again.returncode == 2
    assert "projection: store has 'kronecker', requested 'rademacher'" in again.stderr
