import numpy as np
import pytest

from tests.fixtures.synthetic import synthetic_spec
from trak_dist.errors import StoreStateError
from trak_dist.scoring import ScoringConfig, compute_scores, xtx_from_rows
from trak_dist.store import FeatureStore

N, M, P = 150, 23, 12
T = ScoringConfig(exp_name="t")


def filled_store(path, ids=(0, 1), seed=0):
    spec = synthetic_spec(N, P, dtype="float32", chunk_rows=32)
    store = FeatureStore.create_or_open(path, spec)
    rng = np.random.default_rng(seed)
    data = {}
    store.ensure_experiment("t", M, None)
    for c in ids:
        x = rng.standard_normal((N, P)).astype(np.float32)
        q = rng.uniform(0.1, 1, N).astype(np.float32)
        xt = rng.standard_normal((M, P)).astype(np.float32)
        rows = store.ensure_checkpoint(c)
        rows.write(0, x, q)
        rows.commit(0, N)
        store.write_xtx(c, xtx_from_rows(rows, 0, N, block=40))
        trows = store.ensure_target_checkpoint("t", c)
        trows.write(0, xt)
        trows.commit(0, M)
        data[c] = (x.astype(np.float64), q.astype(np.float64), xt.astype(np.float64))
    return store, data


def dense(data, p, lam, scaling="mean_abs"):
    s, q = 0, 0
    for x, qc, xt in data.values():
        x, xt = x[:, :p], xt[:, :p]
        kinv = np.linalg.inv(x.T @ x + lam * np.eye(p))
        if scaling == "mean_abs":
            kinv /= np.abs(kinv).mean()
        sc = x @ kinv @ xt.T
        if scaling == "per_target":  # each target's column of this checkpoint's S, unit norm
            sc /= np.linalg.norm(sc, axis=0)
        s = s + sc
        q = q + qc
    return s / len(data) * (q / len(data))[:, None]


SCALINGS = [(P, 0.0, "mean_abs"), (5, 0.5, "none"), (P, 0.3, "per_target"), (5, 2.0, "per_target")]


@pytest.mark.parametrize(("train_block", "target_block"), [(4096, 1024), (7, 5), (32, 1)])
@pytest.mark.parametrize(("p", "lam", "scaling"), SCALINGS)
def test_block_scores_equal_a_dense_solve(store_path, train_block, target_block, p, lam, scaling):
    store, data = filled_store(store_path)
    settings = ScoringConfig("t", scaling, 4, train_block=train_block, target_block=target_block)
    sset = compute_scores(store, settings, [0, 1], p, lam)
    ref = dense(data, p, lam, scaling)
    np.testing.assert_allclose(sset.scores(), ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())
    top = sset.read_topk()
    order = np.argsort(-ref, axis=0)
    np.testing.assert_array_equal(top["proponents_idx"], order[:4].T)
    np.testing.assert_array_equal(top["opponents_idx"], np.argsort(ref, axis=0)[:4].T)
    np.testing.assert_allclose(
        top["proponents_val"],
        np.take_along_axis(ref, order[:4], 0).T,
        rtol=1e-5,
        atol=1e-5 * np.abs(ref).max(),
    )


def test_factor_is_reused_across_lambdas(store_path):
    store, _ = filled_store(store_path, ids=(0,))
    compute_scores(store, T, [0], P, 0.1)
    assert store.read_factor(0, P) is not None
    del store.root["train/0/xtx"]  # a recomputation would now fail
    sset = compute_scores(store, T, [0], P, 1.0)
    assert np.isfinite(sset.scores()).all()


def test_scoring_unfinished_features_is_an_error(store_path):
    store, _ = filled_store(store_path, ids=(0,))
    store.ensure_checkpoint(5)
    with pytest.raises(StoreStateError, match="model_id=5"):
        compute_scores(store, T, [0, 5], P, 0.1)
    with pytest.raises(StoreStateError, match="exceeds"):
        compute_scores(store, T, [0], P + 1, 0.1)
