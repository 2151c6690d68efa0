"""TRAKer: equal to traker 0.3.2, to a dense float64 solve, and resumable.

traker's documented workflows (SLURM, shards, custom classes) are in test_traker_workflows.py.
"""

import logging

import numpy as np
import pytest
import torch

from tests.fixtures.helpers import (
    autograd_features,
    classification_data,
    dense_trak_scores,
    mlp,
    q_of,
)
from trak_dist import TRAKer
from trak_dist.errors import ConfigError, StoreStateError, TrakerUsageError
from trak_dist.gradients import GradientComputer
from trak_dist.projection import rademacher_block

N, M = 300, 20


@pytest.fixture(scope="module")
def setup():
    x, y = classification_data(N, seed=0)
    xt, yt = classification_data(M, seed=1)
    model = mlp()
    states = [mlp(seed=s).state_dict() for s in (10, 11, 12)]
    return model, states, (x, y), (xt, yt)


def run(cls, model, states, train, targets, save_dir, batch=64, **kw):
    (x, y), (xt, yt) = train, targets
    t = cls(
        model=model,
        task="image_classification",
        train_set_size=N,
        save_dir=save_dir,
        device="cpu",
        logging_level=logging.ERROR,
        **kw,
    )
    for i, st in enumerate(states):
        t.load_checkpoint(st, model_id=i)
        for b in range(0, N, batch):
            t.featurize((x[b : b + batch], y[b : b + batch]), num_samples=min(batch, N - b))
    t.finalize_features()
    for i, st in enumerate(states):
        t.start_scoring_checkpoint("exp", st, model_id=i, num_targets=M)
        t.score((xt, yt), num_samples=M)
    return np.asarray(t.finalize_scores("exp"), dtype=np.float64)


@pytest.mark.slow
def test_equals_traker_0_3_2_with_identity_projection(setup, tmp_path):
    """traker's NoOpProjector result, fp32, λ > 0, 3 checkpoints: rtol 1e-4 with an absolute
    floor of 1e-4 × max|S| (entries near zero only agree to float32 cancellation)."""
    from trak import TRAKer as TrakerRef
    from trak.projectors import NoOpProjector

    model, states, train, targets = setup
    kw = dict(use_half_precision=False, lambda_reg=1e-2)
    ref = run(
        TrakerRef,
        model,
        states,
        train,
        targets,
        tmp_path / "ref",
        projector=NoOpProjector(device="cpu"),
        **kw,
    )
    ours = run(
        TRAKer,
        model,
        states,
        train,
        targets,
        tmp_path / "ours",
        projector=NoOpProjector(device="cpu"),
        **kw,
    )
    np.testing.assert_allclose(ours, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())
    # and closer to the exact answer than traker's own float32 path
    exact = dense_trak_scores(model, states, *train, *targets, lambda_reg=1e-2)
    err_ours = np.abs(ours - exact).max()
    assert err_ours < 2e-6 * np.abs(exact).max()
    assert err_ours <= np.abs(ref - exact).max()


def test_rademacher_scores_equal_a_dense_projected_solve(setup, tmp_path):
    model, states, train, targets = setup
    p, lam = 32, 1e-3
    ours = run(
        TRAKer,
        model,
        states[:2],
        train,
        targets,
        tmp_path / "s",
        proj_dim=p,
        lambda_reg=lam,
        use_half_precision=False,
        projector_seed=5,
    )
    exact = projected_reference(model, states[:2], train, targets, p, 5, lambda g: lam)
    np.testing.assert_allclose(ours, exact, rtol=1e-4, atol=1e-5 * np.abs(exact).max())


def test_half_precision_is_close(setup, tmp_path):
    model, states, train, targets = setup
    full = run(
        TRAKer,
        model,
        states[:2],
        train,
        targets,
        tmp_path / "a",
        proj_dim=32,
        lambda_reg=1e-3,
        use_half_precision=False,
    )
    half = run(
        TRAKer,
        model,
        states[:2],
        train,
        targets,
        tmp_path / "b",
        proj_dim=32,
        lambda_reg=1e-3,
        use_half_precision=True,
    )
    # fp16 storage of X: ~1e-3 relative per entry, amplified by the inverse's conditioning
    assert np.abs(half - full).max() < 2e-2 * np.abs(full).max()
    assert np.corrcoef(half.ravel(), full.ravel())[0, 1] > 0.999


class CountingComputer(GradientComputer):
    samples = 0

    def per_sample_grads(self, batch):
        CountingComputer.samples += batch[0].shape[0]
        return super().per_sample_grads(batch)


def test_rerun_skips_committed_chunks(setup, tmp_path):
    model, states, train, targets = setup
    (x, y) = train
    kw = dict(
        proj_dim=16,
        lambda_reg=1e-3,
        use_half_precision=False,
        chunk_rows=64,
        gradient_computer=CountingComputer,
    )
    reference = run(TRAKer, model, states[:1], train, targets, tmp_path / "ref", **kw)

    def start():
        t = TRAKer(
            model=model,
            task="image_classification",
            train_set_size=N,
            save_dir=tmp_path / "resumed",
            device="cpu",
            **kw,
        )
        t.load_checkpoint(states[0], model_id=0)
        return t

    # "crashes" after 150 of 300 samples: chunks 0, 1 (rows 0-127) committed, rows 128-149 staged
    first = start()
    first.featurize((x[:150], y[:150]), num_samples=150)
    assert first.store.train_rows(0).done_chunks().tolist() == [1, 1, 0, 0, 0]
    CountingComputer.samples = 0
    second = start()
    for b in range(0, N, 50):
        second.featurize((x[b : b + 50], y[b : b + 50]), num_samples=50)
    assert CountingComputer.samples == N - 150
    second.finalize_features()
    second.start_scoring_checkpoint("exp", states[0], model_id=0, num_targets=M)
    second.score(targets, num_samples=M)
    np.testing.assert_array_equal(np.asarray(second.finalize_scores("exp")), reference)


def test_misuse_gets_clear_errors(setup, tmp_path):
    model, states, (x, y), _ = setup
    t = TRAKer(
        model=model,
        task="image_classification",
        train_set_size=N,
        save_dir=tmp_path / "e",
        device="cpu",
        proj_dim=8,
    )
    with pytest.raises(TrakerUsageError, match="load_checkpoint before featurizing"):
        t.featurize((x, y), num_samples=N)
    t.load_checkpoint(states[0], model_id=0)
    with pytest.raises(TrakerUsageError, match="Exactly one"):
        t.featurize((x, y))
    with pytest.raises(ConfigError, match="must match"):
        t.featurize((x, y), num_samples=10)
    with pytest.raises(ConfigError, match="outside the 300 rows"):
        t.featurize((x[:2], y[:2]), inds=np.array([299, 300]))
    t.featurize((x[:10], y[:10]), num_samples=10)
    with pytest.raises(StoreStateError, match="not fully featurised"):
        t.finalize_features()
    with pytest.raises(ConfigError, match="saver"):
        TRAKer(
            model=model,
            task="image_classification",
            train_set_size=N,
            save_dir=tmp_path,
            device="cpu",
            saver=object(),
        )


def test_load_from_save_dir_false_deletes_nothing_and_overwrite_does(setup, tmp_path):
    """traker's meaning: False ignores what others wrote (defaults cover only this instance's
    checkpoints) but never deletes it; a fresh start is the explicit overwrite=True."""
    model, states, (x, y), _ = setup
    kw = dict(
        model=model,
        task="image_classification",
        train_set_size=N,
        save_dir=tmp_path / "s",
        device="cpu",
        proj_dim=8,
        lambda_reg=1e-3,
        logging_level=logging.ERROR,
    )
    first = TRAKer(**kw)
    first.load_checkpoint(states[0], model_id=0)
    first.featurize((x, y), num_samples=N)
    second = TRAKer(**kw, load_from_save_dir=False)
    assert second.store.train_rows(0).is_complete()  # still there
    second.load_checkpoint(states[1], model_id=1)
    second.featurize((x, y), num_samples=N)
    second.finalize_features()  # only model_id 1: this instance's own
    assert second.store.read_xtx(1) is not None and second.store.read_xtx(0) is None
    assert TRAKer(**kw).saver.model_ids == {
        0: {"is_featurized": 1, "is_finalized": 0},
        1: {"is_featurized": 1, "is_finalized": 1},
    }
    fresh = TRAKer(**kw, overwrite=True)
    assert fresh.store.checkpoint_ids() == [] and fresh.saver.model_ids == {}


def test_traker_gradient_computers_that_cannot_apply_are_named(setup, tmp_path):
    from trak.gradient_computers import IterativeGradientComputer

    model = setup[0]
    kw = dict(model=model, train_set_size=N, save_dir=tmp_path / "s", device="cpu")
    gc = IterativeGradientComputer
    with pytest.raises(ConfigError, match="iterative_image_classification"):
        TRAKer(task="image_classification", gradient_computer=gc, **kw)
    with pytest.raises(ConfigError, match="grad_wrt"):
        TRAKer(task="iterative_image_classification", gradient_computer=gc,
               grad_wrt=["0.weight"], **kw)  # fmt: skip
    with pytest.raises(ConfigError, match="AbstractGradientComputer"):
        TRAKer(task="image_classification", gradient_computer=object, **kw)


def projected_reference(model, states, train, targets, p, seed, lam):
    """docs/design.md's formula with a dense float64 solve; ``lam(g)`` gives each checkpoint's λ."""
    s, q = 0, 0
    for c, st in enumerate(states):
        d = sum(v.numel() for v in st.values())
        proj = rademacher_block(seed, c, 0, d, 0, p, dtype=torch.float64)
        g = autograd_features(model, st, *train) @ proj
        gt = autograd_features(model, st, *targets) @ proj
        kinv = torch.linalg.inv(g.T @ g + lam(g) * torch.eye(p, dtype=torch.float64))
        s = s + g @ (kinv / kinv.abs().mean()) @ gt.T
        q = q + q_of(model, st, *train)
    c = len(states)
    return (s / c * (q / c)[:, None]).numpy()


def test_lambda_zero_is_traker_formula_and_auto_is_the_default(setup, tmp_path):
    """λ=0.0 keeps traker's meaning; no λ means auto: 1.25 × tr(XᵀX) / min(n, p) of each
    checkpoint's XᵀX (here from an SVD of the projected features, independently)."""
    model, states, train, targets = setup
    kw = dict(proj_dim=32, use_half_precision=False, projector_seed=3)
    zero = run(TRAKer, model, states[:2], train, targets, tmp_path / "z", lambda_reg=0.0, **kw)
    ref = projected_reference(model, states[:2], train, targets, 32, 3, lambda g: 0.0)
    np.testing.assert_allclose(zero, ref, rtol=1e-4, atol=1e-5 * np.abs(ref).max())

    def top_eig(g):
        sv = np.linalg.svd(g.numpy().astype(np.float64), compute_uv=False)
        return 1.25 * float((sv**2).sum()) / min(g.shape)

    default = run(TRAKer, model, states[:2], train, targets, tmp_path / "a", **kw)
    ref = projected_reference(model, states[:2], train, targets, 32, 3, top_eig)
    np.testing.assert_allclose(default, ref, rtol=1e-4, atol=1e-5 * np.abs(ref).max())
    assert np.abs(default - zero).max() > 1e-2 * np.abs(zero).max()  # really another λ
