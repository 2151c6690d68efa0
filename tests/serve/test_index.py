"""The index and the attributor against the batch job's stored scores (``compute_scores``)."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch

from tests.fixtures.serve import DigitsJob, P, serve_job
from trak_dist.errors import ConfigError
from trak_dist.examples import digits
from trak_dist.scoring import ScoringConfig, compute_scores
from trak_dist.serve import AttributionIndex
from trak_dist.serve._attributor import Attributor
from trak_dist.store import FeatureStore

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def _assert_topk_matches(top, job: DigitsJob, targets: np.ndarray, k: int) -> None:
    """Indices equal the stored top-k's, except where scores tie (then values equal)."""
    s = job.scores[:, targets]
    for kind, sign in (("proponents", 1.0), ("opponents", -1.0)):
        idx, val = getattr(top, f"{kind}_idx"), getattr(top, f"{kind}_val")
        stored_idx = job.topk[f"{kind}_idx"][targets, :k]
        stored_val = job.topk[f"{kind}_val"][targets, :k]
        np.testing.assert_allclose(val, stored_val, rtol=1e-5, atol=1e-6 * np.abs(s).max())
        # values at the returned indices are the stored scores there
        np.testing.assert_allclose(
            np.take_along_axis(s.T, idx, 1), val, rtol=1e-5, atol=1e-6 * np.abs(s).max()
        )
        order = np.sort(sign * s, axis=0)[::-1][:k].T * sign
        np.testing.assert_allclose(val, order, rtol=1e-5, atol=1e-6 * np.abs(s).max())
        tied = np.isclose(val[:, :-1], val[:, 1:], rtol=1e-6).any()
        if not tied:
            np.testing.assert_array_equal(idx, stored_idx)


def test_index_from_stored_targets_equals_stored_scores(digits_job: DigitsJob) -> None:
    """From the stored target rows, the index gives the stored scores and top-k."""
    store = FeatureStore.open(digits_job.store, mode="r")
    ids = [0, 1]
    for dtype in ("float32", "float16"):
        index = AttributionIndex.from_store(
            store, ids, P, "auto", "mean_abs", dtype, block_rows=500
        )
        assert index.lambdas == pytest.approx(digits_job.lambdas, rel=1e-12)
        m = store.num_targets("targets")
        xt = [store.target_rows("targets", c).read(0, m, P) for c in ids]
        y = index.target_side(xt)
        got = index.scores(y).numpy()
        torch.testing.assert_close(
            got, digits_job.scores, rtol=1e-5, atol=1e-6 * float(np.abs(got).max())
        )
        _assert_topk_matches(index.topk(y, 10), digits_job, np.arange(m), 10)


def test_per_target_index_equals_per_target_scores(digits_job: DigitsJob, tmp_path) -> None:
    """kinv_scaling=per_target: the index scales its query rows as compute_scores scales Y."""
    shutil.copytree(digits_job.store, tmp_path / "s.zarr")
    store = FeatureStore.open(tmp_path / "s.zarr")
    settings = ScoringConfig("targets", "per_target", 10, write_scores="full")
    want = compute_scores(store, settings, [0, 1], P, "auto").scores()
    index = AttributionIndex.from_store(store, [0, 1], P, "auto", "per_target", "float32")
    m = store.num_targets("targets")
    got = index.scores(
        index.target_side([store.target_rows("targets", c).read(0, m, P) for c in (0, 1)])
    )
    torch.testing.assert_close(got.numpy(), want, rtol=1e-5, atol=1e-6 * float(np.abs(want).max()))
    # not the mean_abs scores, rescaled: each checkpoint's weight differs per target
    ratio = want / digits_job.scores
    assert np.nanstd(ratio / np.nanmedian(ratio, axis=0)) > 1e-3


def test_index_memory_mapped(digits_job: DigitsJob, tmp_path) -> None:
    store = FeatureStore.open(digits_job.store, mode="r")
    index = AttributionIndex.from_store(store, [0, 1], P, mmap_dir=tmp_path, block_rows=300)
    assert isinstance(index.x, np.memmap)
    again = AttributionIndex.from_store(store, [0, 1], P, mmap_dir=tmp_path, block_rows=300)
    assert len(list(tmp_path.glob("*.npy"))) == 1  # the second one reused the file
    xt = [store.target_rows("targets", c).read(0, 20, P) for c in (0, 1)]
    got = again.scores(again.target_side(xt)).numpy()
    np.testing.assert_allclose(
        got, digits_job.scores[:, :20], rtol=1e-5, atol=1e-6 * np.abs(got).max()
    )


def test_index_refuses_bad_settings(digits_job: DigitsJob) -> None:
    store = FeatureStore.open(digits_job.store, mode="r")
    with pytest.raises(ConfigError, match=r"proj_dim=4096.*\[1, 128\]"):
        AttributionIndex.from_store(store, [0], 4096)
    with pytest.raises(ConfigError, match="index_dtype='int8'"):
        AttributionIndex.from_store(store, [0], P, dtype="int8")


def test_attributor_featurises_targets_as_the_batch_job(digits_job: DigitsJob) -> None:
    """Raw targets in (the workers' Featurizer, rounded to the float16 store): the stored scores
    and top-k out. Sent as the batch job featurised them (targets 0-63: its first micro-batch of
    64, with serve.featurize_batch=64), the rows are the stored rows and the scores equal at
    rtol 1e-5."""
    att = Attributor(serve_job(digits_job, block_rows=512, featurize_batch=64))
    ds = digits.target_set()
    picks = np.arange(64)
    items = [ds[int(i)] for i in picks]
    got = att.index.scores(att.target_rows(items).to(att.device)).numpy()
    ref = digits_job.scores[:, picks]
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6 * np.abs(ref).max())
    _assert_topk_matches(att.attribute(items, 10), digits_job, picks, 10)


def test_attributor_any_batch(digits_job: DigitsJob) -> None:
    """One target per gradient call (the default), the float32 gradients differ from the batch
    job's micro-batches of 64 in the last bit (BLAS blocks by batch size), and rounding to the
    float16 store can then flip a row's last float16 bit (2**-11): the scores agree to 1e-4 (of
    the largest score) and the top-k indices equal, ties aside. A target's row does not depend
    on the targets sent with it."""
    att = Attributor(serve_job(digits_job, block_rows=512))
    ds = digits.target_set()
    alone = att.target_rows([ds[100]])
    together = att.target_rows([ds[i] for i in (0, 5, 100, 250)])
    assert torch.equal(alone[0], together[2])
    for picks in (np.array([17]), np.array([0, 5, 100, 250, 296])):
        items = [ds[int(i)] for i in picks]
        got = att.index.scores(att.target_rows(items).to(att.device)).numpy()
        ref = digits_job.scores[:, picks]
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())
        top = att.attribute(items, 5)
        for kind in ("proponents", "opponents"):
            np.testing.assert_array_equal(
                getattr(top, f"{kind}_idx"), digits_job.topk[f"{kind}_idx"][picks, :5]
            )
