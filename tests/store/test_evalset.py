"""eval/<exp>: deterministic subsets, complete-or-absent models, settings checked, growth;
damaged models named on read, by `store verify`, and un-done by `store repair`."""

import numpy as np
import pytest

from tests.fixtures.synthetic import synthetic_spec
from trak_dist.errors import StoreDamagedError, StoreMismatchError, StoreStateError
from trak_dist.store import FeatureStore, subset_mask
from trak_dist.store._zarr import group
from trak_dist.store.verify import repair, verify

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


def flip(path, offset=5):
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def done_models(store_path, models, num_models=5):
    store, _ = filled_store(store_path)
    ev = store.ensure_eval("t", settings(num_models=num_models))
    for j in models:
        ev.write(j, np.full(M, j + 1, np.float32))
    return ev


def test_damaged_subset_models_are_named_verified_and_repaired(store_path):
    done_models(store_path, [0, 1, 2, 3])
    assert not verify(store_path).problems
    flip(store_path / "eval" / "t" / "margins" / "c" / "1" / "0")
    (store_path / "eval" / "t" / "margins" / "c" / "2" / "0").unlink()
    flip(store_path / "eval" / "t" / "masks" / "c" / "4" / "0")  # a model not trained yet

    ev = FeatureStore.open(store_path).eval_set("t")
    with pytest.raises(StoreDamagedError) as e:
        ev.finished()
    assert "eval/t/margins of subset model 1 fails its checksum" in str(e.value)
    assert "eval/t/margins of subset model 2 is missing, though committed" in str(e.value)
    assert "only these subset models are trained again" in str(e.value)
    with pytest.raises(StoreDamagedError, match="eval/t/masks of subset model 4 fails"):
        ev.mask(4)  # never trained on a damaged subset

    whats = {p.what for p in verify(store_path).problems}
    assert whats == {
        "eval/t/margins of subset model 1 fails its checksum (its bytes changed on disk)",
        "eval/t/margins of subset model 2 is missing, though committed",
        "eval/t/masks of subset model 4 fails its checksum (its bytes changed on disk)",
    }
    _, actions = repair(store_path)
    assert actions == [
        "un-did 3 subset model(s) of eval/t ([1, 2, 4]): `trak-dist eval` trains them again"
    ]
    assert not verify(store_path).problems
    ev = FeatureStore.open(store_path).eval_set("t")
    np.testing.assert_array_equal(ev.done(), [True, False, False, True, False])
    masks, margins = ev.finished()  # the whole models are kept as they were
    np.testing.assert_array_equal(masks, [subset_mask(N, 0.5, 0, 0), subset_mask(N, 0.5, 0, 3)])
    np.testing.assert_array_equal(margins, [np.full(M, 1.0), np.full(M, 4.0)])
    np.testing.assert_array_equal(ev.mask(4), subset_mask(N, 0.5, 0, 4))


def test_a_mask_that_is_not_its_settings_subset_is_refused(store_path):
    ev = done_models(store_path, [])
    ev.masks[2] = ~subset_mask(N, 0.5, 0, 2)  # whole bytes, wrong subset
    with pytest.raises(StoreDamagedError, match="subset model 2 differs from the subset its"):
        ev.mask(2)
    (problem,) = verify(store_path).problems
    assert problem.uncommit == ("eval/t", 2)
    repair(store_path)
    np.testing.assert_array_equal(ev.mask(2), subset_mask(N, 0.5, 0, 2))


def test_a_damaged_done_flag_is_rewritten_only_over_whole_margins(store_path):
    done_models(store_path, [0, 1])
    flip(store_path / "eval" / "t" / "done" / "c" / "0", offset=0)
    flip(store_path / "eval" / "t" / "done" / "c" / "1", offset=0)
    flip(store_path / "eval" / "t" / "margins" / "c" / "1" / "0")
    with pytest.raises(StoreDamagedError, match="eval/t/done of subset model 0 fails"):
        FeatureStore.open(store_path).eval_set("t").done()
    whats = sorted(p.what for p in verify(store_path).problems)
    assert whats == [
        "eval/t/done of subset model 0 fails its checksum; its margins are whole",
        "eval/t/done of subset model 1 fails its checksum; its margins are not whole",
        "eval/t/margins of subset model 1 fails its checksum (its bytes changed on disk)",
    ]
    repair(store_path)
    assert not verify(store_path).problems
    ev = FeatureStore.open(store_path).eval_set("t")
    np.testing.assert_array_equal(ev.done(), [True, False, False, False, False])
    np.testing.assert_array_equal(ev.finished()[1], [np.full(M, 1.0)])


def test_torn_or_unfinished_eval_metadata_is_named_and_dropped(store_path):
    done_models(store_path, [0])
    meta = store_path / "eval" / "t" / "margins" / "zarr.json"
    meta.write_bytes(meta.read_bytes()[:40])
    with pytest.raises(StoreStateError, match=r"eval/t/margins/zarr.json"):
        FeatureStore.open(store_path)
    _, actions = repair(store_path)
    assert "dropped eval/t" in actions
    store = FeatureStore.open(store_path)
    assert store.eval_set("t") is None and not verify(store_path).problems
    # an evaluation killed before its settings were written: dropped, then made afresh
    group(store.root, "eval").require_group("u").create_array("masks", shape=(1,), dtype="bool")
    (problem,) = verify(store_path).problems
    assert problem.what == "eval/u is incomplete (an evaluation stopped while creating it)"
    repair(store_path)
    assert "u" not in group(FeatureStore.open(store_path).root, "eval")
