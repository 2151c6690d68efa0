"""The LDS against scipy's Spearman and a brute-force bootstrap."""

import numpy as np
import pytest
from scipy.stats import spearmanr

from trak_dist.lds import lds, predictions, spearman


def correlated(models=40, targets=25, noise=1.5, seed=0):
    rng = np.random.default_rng(seed)
    actual = rng.standard_normal((models, targets))
    return actual + noise * rng.standard_normal(actual.shape), actual


def test_spearman_per_column_equals_scipy():
    pred, actual = correlated()
    pred[:, 3] = np.round(pred[:, 3])  # ties: average ranks, as scipy
    ref = [spearmanr(pred[:, t], actual[:, t]).statistic for t in range(pred.shape[1])]
    np.testing.assert_allclose(spearman(pred, actual), ref, rtol=1e-12, atol=1e-12)


def test_constant_columns_are_left_out_of_the_mean():
    pred, actual = correlated()
    pred[:, 0] = 1.0
    res = lds(pred, actual, bootstrap=0)
    assert np.isnan(res.per_target[0]) and res.targets == pred.shape[1] - 1
    assert res.lds == pytest.approx(np.mean(spearman(pred[:, 1:], actual[:, 1:])), rel=1e-12)


def test_bootstrap_equals_resampling_models_and_targets_explicitly():
    pred, actual = correlated(models=15, targets=8)
    res = lds(pred, actual, bootstrap=200, level=0.9, seed=7)
    rng = np.random.default_rng(7)  # the same draws, used the slow way
    draws = []
    for _ in range(200):
        rows = rng.integers(0, 15, 15)
        cols = rng.integers(0, 8, 8)
        p, a = pred[np.ix_(rows, cols)], actual[np.ix_(rows, cols)]
        draws.append(np.nanmean([spearmanr(p[:, t], a[:, t]).statistic for t in range(8)]))
    low, high = np.nanquantile(draws, [0.05, 0.95])
    assert (res.low, res.high) == pytest.approx((low, high), rel=1e-10)
    assert res.low < res.lds < res.high
    again = lds(pred, actual, bootstrap=200, level=0.9, seed=7)  # deterministic
    assert (again.lds, again.low, again.high) == (res.lds, res.low, res.high)


def test_interval_narrows_with_more_models():
    small = lds(*correlated(models=20, seed=1), bootstrap=300)
    large = lds(*correlated(models=400, seed=1), bootstrap=300)
    assert large.high - large.low < (small.high - small.low) / 2
    # noise 1.5 on unit signal: Spearman ≈ (6/π)·asin(ρ/2), ρ = 1/sqrt(1 + 1.5²)
    expected = 6 / np.pi * np.arcsin(1 / np.sqrt(1 + 1.5**2) / 2)
    assert large.low < expected < large.high


def test_predictions_sum_the_scores_of_each_subset():
    rng = np.random.default_rng(2)
    masks = rng.random((6, 30)) < 0.5
    scores = rng.standard_normal((30, 4))
    ref = np.array([[scores[masks[j], t].sum() for t in range(4)] for j in range(6)])
    np.testing.assert_allclose(predictions(masks, scores), ref, rtol=1e-12)
