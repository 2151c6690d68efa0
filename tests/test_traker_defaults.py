"""One default at every door: ``TRAKer(task="causal_lm")`` resolves ``proj_dim``, the projection
and the curvature as ``trak-dist`` and ``trak_dist.run`` do (``tasks.task_defaults``), gives the
same scores as ``trak_dist.run`` on a tiny causal LM, and explicit arguments win."""

import logging
from functools import partial

import numpy as np
import pytest
import torch

import trak_dist as td
from tests.fixtures.helpers import one_thread, random_states
from trak_dist import TRAKer
from trak_dist._compose import compose_job
from trak_dist.config import ClusterConfig
from trak_dist.errors import ConfigError
from trak_dist.examples import tiny_lm
from trak_dist.sources import batch_of
from trak_dist.store import FeatureStore
from trak_dist.tasks import resolve_curvature, resolve_task

N, M, EMBD, P = 16, 4, 16, 256
make_model = partial(tiny_lm.make_model, n_embd=EMBD)
train_set = partial(tiny_lm.train_set, limit=N)
target_set = partial(tiny_lm.target_set, limit=M)
# what the store records of the features and K: equal specs, equal numbers to expect
SETTINGS = ("proj_dim", "projection", "projection_params", "seed", "curvature", "fisher_draws")


def settings(spec) -> dict:  # type: ignore[no-untyped-def]
    return {k: getattr(spec, k) for k in SETTINGS}


def traker(save_dir, task="causal_lm", **kw) -> TRAKer:  # type: ignore[no-untyped-def]
    return TRAKer(
        model=make_model(),
        task=task,
        train_set_size=N,
        save_dir=save_dir,
        device="cpu",
        logging_level=logging.ERROR,
        **kw,
    )


@pytest.fixture(scope="module")
def states(tmp_path_factory):
    """Two random-weight tiny_lm checkpoints (no training: the test compares two doors)."""
    return random_states(tmp_path_factory.mktemp("states"), make_model)


def test_traker_causal_lm_resolves_to_the_cli_s_defaults(tmp_path):
    cli = compose_job(["task=causal_lm"])
    curvature = resolve_curvature(cli.featurize.curvature, resolve_task(cli.task.name))
    t = traker(tmp_path / "t")
    assert (t.proj_dim, t.store.spec.projection) == (cli.proj_dim, cli.projection.kind)
    assert (t.store.spec.curvature, t.store.spec.fisher_draws) == (
        curvature,
        cli.featurize.fisher_draws,
    )
    assert (cli.proj_dim, cli.projection.kind, curvature) == (2048, "kronecker", "fisher")
    # kinv_scaling=auto, resolved from the store's spec as the CLI's scores resolve it
    assert t.kinv_scaling == "per_target"


def test_explicit_arguments_win_and_other_tasks_keep_traker_s(tmp_path):
    pinned = traker(tmp_path / "a", proj_dim=64, projection="rademacher", curvature="xtx")
    assert settings(pinned.store.spec) | {"projection_params": ""} == {
        "proj_dim": 64,
        "projection": "rademacher",
        "projection_params": "",
        "seed": 0,
        "curvature": "xtx",
        "fisher_draws": 1,
    }
    assert pinned.kinv_scaling == "mean_abs"  # auto without the Fisher: traker's
    # each argument alone: the others stay the task's
    width = traker(tmp_path / "b", proj_dim=64)
    assert (width.proj_dim, width.store.spec.projection, width.store.spec.curvature) == (
        64,
        "kronecker",
        "fisher",
    )
    xtx = traker(tmp_path / "c", curvature="xtx", kinv_scaling="mean_abs", fisher_draws=1)
    assert (xtx.proj_dim, xtx.store.spec.curvature, xtx.kinv_scaling) == (2048, "xtx", "mean_abs")
    # a classifier keeps traker 0.3.2's defaults: dense p = 2048, XᵀX, mean_abs
    model = torch.nn.Linear(4, 3)
    clf = TRAKer(model, "image_classification", 8, tmp_path / "d", device="cpu")
    assert (clf.proj_dim, clf.store.spec.projection, clf.store.spec.curvature) == (
        2048,
        "rademacher",
        "xtx",
    )
    assert clf.kinv_scaling == "mean_abs"
    with pytest.raises(ConfigError, match="fisher_draws=2"):
        traker(tmp_path / "e", curvature="xtx", fisher_draws=2)


def test_a_traker_projector_takes_xtx_and_refuses_the_fisher(tmp_path):
    """traker's own projector cannot give the Fisher's rows: with a causal LM, ``auto`` becomes
    XᵀX, and an explicit ``fisher`` is one clear error before anything is stored."""
    from trak.projectors import BasicProjector

    def projector() -> BasicProjector:
        d = sum(p.numel() for p in make_model().parameters())
        return BasicProjector(grad_dim=d, proj_dim=32, seed=0, proj_type="rademacher", device="cpu")

    auto = traker(tmp_path / "auto", projector=projector())
    assert (auto.store.spec.curvature, auto.kinv_scaling) == ("xtx", "mean_abs")
    assert auto.store.spec.projection.startswith("traker:")
    assert (tmp_path / "auto" / "zarr.json").is_file()  # where a store would be
    with pytest.raises(ConfigError, match="curvature='fisher' needs trak_dist's own"):
        traker(tmp_path / "fisher", projector=projector(), curvature="fisher")
    assert not (tmp_path / "fisher" / "zarr.json").exists()


def test_traker_causal_lm_scores_equal_trak_dist_run_s(tmp_path, states):
    """Both doors' defaults (the Kronecker projection, the sampled-label Fisher, λ auto,
    per-target weights): ``trak_dist.run`` (the CLI's pipeline, whole chunks) and TRAKer (rows
    staged in shadows and folded, batches out of order) give the same scores. p is set, the
    same at both doors: the default's 2048 × 2048 float64 eigendecompositions take ~10 s each
    on a CPU (its resolution is the test above)."""
    result = td.run(
        model=make_model,
        checkpoints=[str(p) for p in states],
        train=train_set,
        targets=target_set,
        task="causal_lm",
        store=tmp_path / "run.zarr",
        proj_dim=P,
        cluster=ClusterConfig(kind="inprocess"),
        progress=False,
        report=None,
    )
    run_spec = FeatureStore.open(tmp_path / "run.zarr", mode="r").spec
    train, targets = batch_of(train_set(), 0, N), batch_of(target_set(), 0, M)
    order = torch.randperm(N, generator=torch.Generator().manual_seed(0))
    with one_thread():  # as the in-process run's one worker: the same summation order
        t = traker(tmp_path / "t", proj_dim=P)
        assert settings(t.store.spec) == settings(run_spec)
        assert (run_spec.projection, run_spec.curvature) == ("kronecker", "fisher")
        for i, path in enumerate(states):
            t.load_checkpoint(torch.load(path, weights_only=True), model_id=i)
            for part in (order[:5], order[5:11], order[11:]):
                t.featurize({k: v[part] for k, v in train.items()}, inds=part)
        t.finalize_features()
        for i, path in enumerate(states):
            state = torch.load(path, weights_only=True)
            t.start_scoring_checkpoint("targets", state, model_id=i, num_targets=M)
            t.score(targets, num_samples=M)
        ours = t.finalize_scores("targets")
    assert result.variant == f"p{P}_lambdaauto_pertarget"
    expected = result.scores()
    assert expected.shape == ours.shape == (N, M)
    np.testing.assert_allclose(ours, expected, rtol=1e-5, atol=1e-5 * np.abs(expected).max())
