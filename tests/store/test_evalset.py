"""eval/<exp>: deterministic subsets, complete-or-absent models, settings checked, growth."""

import numpy as np
import pytest

from benchmarks._synthetic import synthetic_spec
from trak_dist.errors import StoreMismatchError
from trak_dist.store import FeatureStore, subset_mask

N, M = 150, 23


def filled_store(path):
    store = FeatureStore.create_or_open(path, synthetic_spec(N, 8))
    store.ensure_experiment("t", M, None)
    return store, None


def settings(**kw):
    base = {
        "recipe": "pkg.mod:train",
        "recipe_kwargs": {},
        "num_models": 5,
        "alpha": 0.5,
        "seed": 0,
        "train_size": N,
        "num_targets": M,
        "train_fingerprint": "synthetic",
    }
    return {**base, **kw}


def test_subsets_are_deterministic_halves():
    masks = np.stack([subset_mask(N, 0.5, 3, j) for j in range(20)])
    assert (masks.sum(1) == 75).all()
    np.testing.assert_array_equal(masks[7], subset_mask(N, 0.5, 3, 7))
    assert not (masks[0] == masks[1]).all()
    assert not (subset_mask(N, 0.5, 4, 0) == masks[0]).all()
    assert 0.4 < masks.mean(0).mean() < 0.6 and masks.mean(0).std() < 0.2  # no favourite rows


def test_models_are_stored_complete_or_absent(store_path):
    store, _ = filled_store(store_path)
    ev = store.ensure_eval("t", settings())
    for j in range(5):
        np.testing.assert_array_equal(ev.mask(j), subset_mask(N, 0.5, 0, j))
    margins = np.arange(M, dtype=np.float32)
    ev.write(3, margins)
    ev.margins[1] = margins + 1  # a model killed after its margins, before its done flag
    again = FeatureStore.open(store_path).eval_set("t")
    assert again is not None
    np.testing.assert_array_equal(again.done(), [False, False, False, True, False])
    masks, got = again.finished()
    np.testing.assert_array_equal(masks, [subset_mask(N, 0.5, 0, 3)])
    np.testing.assert_array_equal(got, [margins])


def test_other_settings_are_a_mismatch_unless_overwritten(store_path):
    store, _ = filled_store(store_path)
    store.ensure_eval("t", settings()).write(0, np.zeros(M, np.float32))
    with pytest.raises(StoreMismatchError, match=r"alpha: stored 0\.5, requested 0\.3"):
        store.ensure_eval("t", settings(alpha=0.3))
    fresh = store.ensure_eval("t", settings(alpha=0.3), overwrite=True)
    assert not fresh.done().any() and fresh.mask(0).sum() == 45


def test_more_models_grow_the_set_and_keep_the_finished_ones(store_path):
    store, _ = filled_store(store_path)
    ev = store.ensure_eval("t", settings())
    ev.write(4, np.ones(M, np.float32))
    grown = store.ensure_eval("t", settings(num_models=8))
    assert grown.num_models == 8 and grown.settings["num_models"] == 8
    np.testing.assert_array_equal(np.flatnonzero(grown.done()), [4])
    np.testing.assert_array_equal(grown.mask(7), subset_mask(N, 0.5, 0, 7))
    assert store.ensure_eval("t", settings(num_models=3)).num_models == 8  # never shrinks
