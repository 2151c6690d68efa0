"""Kronecker projection through the pipeline: plain Worker/Reducer in any order, real Ray with 1
and 2 workers (bitwise the same features and scores), and the Reducer's order-free sum."""

import functools
import math

import numpy as np
import pytest

import trak_dist
from tests.fixtures.pipeline import WIDE, kron_job, run_in_process, stored_features
from tests.fixtures.synthetic import synthetic_spec
from trak_dist.distributed import run_job
from trak_dist.examples import digits
from trak_dist.pipeline import Reducer
from trak_dist.store import FeatureStore


@pytest.fixture(scope="module")
def wide_checkpoints(tmp_path_factory):
    cache = tmp_path_factory.mktemp("cache")
    return digits.checkpoints(num=1, epochs=3, cache_dir=str(cache), hidden=WIDE)


def test_plain_classes_give_the_same_bits_in_any_order(tmp_path, wide_checkpoints):
    cfg = kron_job(tmp_path / "a.zarr", wide_checkpoints, gradient_engine="hooks")
    run_in_process(cfg)
    assert FeatureStore.open(cfg.store.path).spec.projection == "kronecker"
    x, s = stored_features(cfg)
    # the shards finishing in reverse order (as with several workers) change nothing
    cfg_rev = kron_job(tmp_path / "b.zarr", wide_checkpoints, gradient_engine="hooks")
    run_in_process(cfg_rev, reverse=True)
    x_rev, s_rev = stored_features(cfg_rev)
    np.testing.assert_array_equal(x_rev, x)
    np.testing.assert_array_equal(s_rev, s)


def test_reducer_sum_does_not_depend_on_the_order(tmp_path):
    """Partials of very different magnitudes: a plain float64 sum changes its last bits with the
    order; the reducer's does not."""
    p, n = 16, 8 * 64
    store = FeatureStore.create_or_open(tmp_path / "s.zarr", synthetic_spec(n, p, chunk_rows=64))
    store.ensure_checkpoint(0, "synthetic")
    rng = np.random.default_rng(0)
    partials = [rng.standard_normal((p, p)) * 10.0 ** rng.integers(-8, 9) for _ in range(8)]
    results, naive = [], []
    for order in ([0, 1, 2, 3, 4, 5, 6, 7], [7, 6, 5, 4, 3, 2, 1, 0], [3, 0, 6, 1, 7, 2, 5, 4]):
        reducer = Reducer(str(tmp_path / "s.zarr"))
        for i in order:
            reducer.add(0, 64 * i, 64 * (i + 1), partials[i])  # the last one writes XᵀX
        results.append(reducer.store.read_xtx(0))
        total = np.zeros((p, p))
        for i in order:
            total += partials[i]
        naive.append(total)
    assert any((a != naive[0]).any() for a in naive[1:])  # the orders do matter for a plain sum
    for r in results[1:]:
        np.testing.assert_array_equal(r, results[0])
    # and it is the correctly rounded sum (math.fsum), entry by entry
    exact = np.vectorize(lambda *v: math.fsum(v))(*partials)
    np.testing.assert_array_equal(results[0], exact)


@pytest.mark.ray
@pytest.mark.slow
def test_one_and_two_ray_workers_give_the_same_bits(ray_session, tmp_path, wide_checkpoints):
    """trak_dist.run with 1 worker, then the driver with 2 workers twice: the same bits."""
    one = kron_job(tmp_path / "one.zarr", wide_checkpoints, workers=1)
    trak_dist.run(
        functools.partial(digits.make_model, hidden=WIDE),
        [str(c) for c in wide_checkpoints],
        "trak_dist.examples.digits:train_set",
        "trak_dist.examples.digits:target_set",
        store=one.store.path,
        proj_dim=one.proj_dim,
        lambda_reg=one.lambda_reg,
        num_workers=1,
        projection=one.projection,
        featurize=one.featurize,
        progress=False,
        report=None,
    )
    runs = [stored_features(one)]
    for name in ("two", "two-again"):
        cfg = kron_job(tmp_path / f"{name}.zarr", wide_checkpoints, workers=2)
        run_job(cfg)
        runs.append(stored_features(cfg))
    for x, s in runs[1:]:
        np.testing.assert_array_equal(x, runs[0][0])
        np.testing.assert_array_equal(s, runs[0][1])
