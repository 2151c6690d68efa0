"""The index's top-k pass (float32 and float16 storage, in memory and memory-mapped, any block
size) and the approximate faiss index, against a float64 numpy reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.fixtures.helpers import one_thread
from trak_dist.errors import ConfigError
from trak_dist.serve import AttributionIndex
from trak_dist.serve._ann import AnnIndex


def _index(
    x, q: np.ndarray, c: int, block_rows: int | None, chunk_rows: int = 65536, threads: int = 1
) -> AttributionIndex:
    p = x.shape[1] // c
    kinvs = [torch.eye(p, dtype=torch.float64)] * c  # target_side is tested in test_index.py
    q_t = torch.from_numpy(q)
    return AttributionIndex(x, q_t, kinvs, [1.0] * c, block_rows, "cpu", chunk_rows, threads)


def _reference(x: np.ndarray, q: np.ndarray, y: np.ndarray, c: int) -> np.ndarray:
    """``[m, n]`` float64 scores: (Σ_c X_c · Y_c / C) · (Σ_c Q_c / C)."""
    return (y.astype(np.float64) @ x.astype(np.float64).T / c) * (q.astype(np.float64) / c)


def _check_topk(top, s64: np.ndarray, k: int, rtol: float, atol: float) -> None:
    """Values equal the reference's k largest / smallest; indices point at those values and
    equal the reference's where no two reference values are within the tolerance (ties)."""
    for idx, val, sign in (
        (top.proponents_idx, top.proponents_val, -1.0),
        (top.opponents_idx, top.opponents_val, 1.0),
    ):
        ref = np.argsort(sign * s64, axis=1, kind="stable")[:, :k]
        order = np.take_along_axis(s64, ref, 1)
        assert idx.shape == val.shape == order.shape
        np.testing.assert_allclose(val, order, rtol=rtol, atol=atol)
        np.testing.assert_allclose(np.take_along_axis(s64, idx, 1), val, rtol=rtol, atol=atol)
        for t in range(s64.shape[0]):
            # the k-th and (k+1)-th apart too, or the last place may go either way
            nxt = np.sort(sign * s64[t])[: k + 1] * sign
            if (np.abs(np.diff(nxt)) > 2 * (rtol * np.abs(nxt[1:]) + atol)).all():
                np.testing.assert_array_equal(idx[t], ref[t])


@pytest.mark.parametrize(
    ("n", "c", "block_rows", "chunk_rows", "k"),
    [
        (3000, 1, None, 65536, 10),
        (2999, 3, 256, 1000, 10),  # chunks of 4 blocks, the last ones partial
        (700, 2, 7, 7, 12),  # chunks shorter than k
        (50, 1, 1000, 65536, 50),  # k = n
    ],
)
def test_exact_paths_equal_float64(
    tmp_path, n: int, c: int, block_rows: int | None, chunk_rows: int, k: int
):
    """A float16 store served from a float16 or float32 index, in memory or memory-mapped:
    every stored value is a float32, so only the float32 accumulation differs from float64
    (rtol 1e-5, atol 1e-6 of the largest score)."""
    rng = np.random.default_rng(n + c)
    p = 24
    x16 = rng.standard_normal((n, c * p), dtype=np.float32).astype(np.float16)
    q = rng.uniform(0.05, 1.0, n).astype(np.float32) * c  # Σ_c Q_c
    y = rng.standard_normal((5, c * p), dtype=np.float32)
    s64 = _reference(x16, q, y, c)
    atol = 1e-6 * np.abs(s64).max()
    np.save(tmp_path / "x.npy", x16)
    for x in (
        torch.from_numpy(x16),
        torch.from_numpy(x16.astype(np.float32)),
        np.load(tmp_path / "x.npy", mmap_mode="c"),
    ):
        index = _index(x, q, c, block_rows, chunk_rows)
        yt = torch.from_numpy(y)
        np.testing.assert_allclose(index.scores(yt).numpy().T, s64, rtol=1e-5, atol=atol)
        top = index.topk(yt, k)
        _check_topk(top, s64, min(k, n), 1e-5, atol)
        # chunks shared out over pass threads: the same bits as one thread (a matmul's rounding
        # depends on its torch threads: one per pass thread, and one here, as in a replica)
        with one_thread():
            one = _index(x, q, c, block_rows, chunk_rows).topk(yt, k)
            for threads in (2, 3):
                shared = _index(x, q, c, block_rows, chunk_rows, threads).topk(yt, k)
                for field in ("proponents_idx", "proponents_val", "opponents_idx", "opponents_val"):
                    np.testing.assert_array_equal(getattr(shared, field), getattr(one, field))


def test_float16_index_of_float32_rows_within_its_rounding():
    """A float32 store held as float16: each entry rounds to 11 significant bits (relative
    error ≤ 2⁻¹¹), so a score moves by at most 2⁻¹¹ Σ_j |x_ij y_j| · w_i: checked entry by
    entry against float64, and the values at the returned indices are the rounded scores."""
    rng = np.random.default_rng(5)
    n, p = 2000, 64
    x = rng.standard_normal((n, p), dtype=np.float32)
    q = rng.uniform(0.05, 1.0, n).astype(np.float32)
    y = rng.standard_normal((3, p), dtype=np.float32)
    index = _index(torch.from_numpy(x).half(), q, 1, 128)
    got = index.scores(torch.from_numpy(y)).numpy().T
    s64 = _reference(x, q, y, 1)
    bound = 2.0**-11 * (np.abs(y) @ np.abs(x).T) * q + 1e-6 * np.abs(s64).max()
    assert (np.abs(got - s64) <= bound).all()
    assert np.abs(got - s64).max() > 1e-6 * np.abs(s64).max()  # it did round (not float32)
    top = index.topk(torch.from_numpy(y), 10)
    np.testing.assert_array_equal(
        np.take_along_axis(got, top.proponents_idx, 1), top.proponents_val
    )


def _clustered(rng: np.random.Generator, n: int, width: int, clusters: int) -> np.ndarray:
    centres = rng.standard_normal((clusters, width), dtype=np.float32) * 4
    return centres[rng.integers(0, clusters, n)] + rng.standard_normal((n, width), np.float32)


def test_faiss_index_recall_and_scores():
    """IVF over w ⊙ X: searching every list is exhaustive, so its top-k is the exact one
    (recall 1, scores to float32 rounding); with 4 of 32 lists on clustered rows whose targets
    lie near the clusters, recall@10 is measured against the float64 top-k."""
    rng = np.random.default_rng(11)
    n, c, p, k = 6000, 2, 16, 10
    x = _clustered(rng, n, c * p, 32)
    q = rng.uniform(0.5, 1.0, n).astype(np.float32) * c
    y = _clustered(rng, 20, c * p, 32)
    s64 = _reference(x, q, y, c)
    exact = _index(torch.from_numpy(x), q, c, 512)
    yt = torch.from_numpy(y)
    full = AnnIndex(exact, "IVF32,Flat", nprobe=32)
    _check_topk(full.topk(yt, k), s64, k, 1e-5, 1e-6 * np.abs(s64).max())
    some = AnnIndex(exact, "IVF32,Flat", nprobe=4).topk(yt, k)
    want = np.argsort(-s64, axis=1)[:, :k]
    pairs = zip(some.proponents_idx, want, strict=True)
    recall = np.mean([len(set(a) & set(b)) / k for a, b in pairs])  # 0.98 when written
    assert recall >= 0.9, recall
    found = some.proponents_idx >= 0
    np.testing.assert_allclose(
        np.take_along_axis(s64, np.where(found, some.proponents_idx, 0), 1)[found],
        some.proponents_val[found],
        rtol=1e-5,
        atol=1e-6 * np.abs(s64).max(),
    )


def test_faiss_refuses_a_bad_factory():
    x = np.zeros((100, 8), np.float32)
    exact = _index(torch.from_numpy(x), np.ones(100, np.float32), 1, None)
    with pytest.raises(ConfigError, match=r"serve\.ann=.NotAnIndex."):
        AnnIndex(exact, "NotAnIndex", nprobe=1)
