"""Checksums, sentinels, complete-or-absent reductions, row hashes and verify/repair on real
Zarr stores (synthetic rows; the fault matrix in tests/faults runs whole jobs)."""

import json
import threading

import numpy as np
import pytest
import torch
import zarr
from torch.utils.data import TensorDataset

from tests.fixtures.synthetic import synthetic_spec
from trak_dist.errors import StoreDamagedError, StoreMismatchError, StoreStateError
from trak_dist.store import (
    CODECS,
    FeatureStore,
    dataset_fingerprint,
    dataset_row_hashes,
    row_hashes,
)
from trak_dist.store._integrity import checked_read
from trak_dist.store._layout import TOPK_ARRAYS
from trak_dist.store._metadata import unreadable_metadata
from trak_dist.store._zarr import compressors
from trak_dist.store.verify import repair, verify

N, P, CHUNK = 100, 8, 32


def filled(path, ids=(0,), dtype="float32"):
    store = FeatureStore.create_or_open(path, synthetic_spec(N, P, dtype=dtype, chunk_rows=CHUNK))
    rng = np.random.default_rng(0)
    for c in ids:
        rows = store.ensure_checkpoint(c, f"ckpt{c}")
        store.bind(rows, f"ckpt{c}", f"model_id={c}")
        rows.write(0, rng.standard_normal((N, P)), rng.uniform(size=N), np.arange(1, N + 1))
        rows.commit(0, N)
        store.write_xtx(c, np.eye(P))
    return store


def flip(path, offset=5):
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_every_codec_ends_in_a_checksum_that_catches_one_flipped_bit(tmp_path, codec, dtype):
    arr = zarr.open_group(tmp_path / "g.zarr", mode="a").create_array(
        "X",
        shape=(64, 16),
        chunks=(32, 16),
        dtype=dtype,
        compressors=compressors(codec),
        fill_value=np.nan,
    )
    x = np.random.default_rng(1).standard_normal((64, 16)).astype(dtype)
    arr[:] = x
    np.testing.assert_array_equal(checked_read(arr, (slice(0, 64), slice(0, 16))), x)
    flip(tmp_path / "g.zarr" / "X" / "c" / "1" / "0")
    with pytest.raises(
        StoreDamagedError, match=r"X chunk 1 \(rows \[32, 64\)\) fails its checksum"
    ) as e:
        checked_read(arr, (slice(0, 64), slice(0, 16)))
    assert [d.chunk for d in e.value.damage] == [(1, 0)]
    # the chunk before it still reads
    np.testing.assert_array_equal(checked_read(arr, (slice(0, 32), slice(0, 16))), x[:32])


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_rows_name_missing_and_non_finite_chunks(store_path, dtype):
    store = filled(store_path, dtype=dtype)
    rows = store.train_rows(0)
    (store_path / "train" / "0" / "X" / "c" / "2" / "0").unlink()
    with pytest.raises(
        StoreDamagedError, match=r"train/0/X chunk 2 \(rows \[64, 96\)\) is missing"
    ):
        rows.read(0, N)
    np.testing.assert_equal(rows.read(0, 64).shape, (64, P))  # the others read
    bad = np.ones((CHUNK, P))
    bad[3, 1] = np.inf
    rows.X[0:CHUNK] = bad.astype(dtype)  # beneath RowSet.write, which refuses such rows
    with pytest.raises(StoreDamagedError, match=r"chunk 0 .* holds non-finite values"):
        rows.read(0, CHUNK)
    (store_path / "train" / "0" / "Q" / "c" / "3").unlink()
    with pytest.raises(StoreDamagedError, match=r"train/0/Q chunk 3 \(rows \[96, 100\)\)"):
        rows.read_q(90, N)


def test_a_reduction_is_complete_or_absent(store_path):
    store = filled(store_path)
    np.testing.assert_array_equal(store.read_xtx(0), np.eye(P))
    node = store.root["train/0"]
    # what a writer killed between metadata and data (or out of disk) leaves behind
    node.create_array(
        "xtx", shape=(P, P), dtype="float64", overwrite=True, attributes={"complete": False}
    )
    assert store.read_xtx(0) is None
    store.write_factor(0, P, np.ones(P), np.eye(P))
    assert store.read_factor(0, P) is not None
    store.write_xtx(0, 2 * np.eye(P))  # a new XᵀX drops the factorisations of the old one
    assert store.read_factor(0, P) is None
    np.testing.assert_array_equal(store.read_xtx(0), 2 * np.eye(P))
    flip(store_path / "train" / "0" / "xtx" / "c" / "0" / "0")
    assert store.read_xtx(0) is None  # damaged: recomputed from the rows, not used


def write_scores(store, variant, value, topk, model_ids=(0,), fail=False):
    with store.create_scores("t", variant, N, 3, topk, {"model_ids": list(model_ids)}) as sset:
        sset.write_block(0, 0, np.full((N, 3), value, np.float32))
        if fail:
            raise OSError(28, "No space left on device")
        idx = np.zeros((3, topk), np.int64)
        sset.write_topk(
            0, {k: idx if k.endswith("idx") else idx.astype(np.float32) for k in TOPK_ARRAYS}
        )
    return sset.publish()


def test_scores_replace_the_previous_set_only_when_complete(store_path):
    store = filled(store_path)
    write_scores(store, "v", 1.0, 2)
    with pytest.raises(OSError):
        write_scores(store, "v", 2.0, 3, fail=True)
    kept = store.score_set("t", "v")
    assert kept is not None and kept.topk == 2
    np.testing.assert_array_equal(kept.scores(), np.ones((N, 3)))
    assert sorted(store.root["scores/t"].group_keys()) == ["v"]  # the partial set is gone
    write_scores(store, "v", 3.0, 4)
    np.testing.assert_array_equal(store.score_set("t", "v").scores(), np.full((N, 3), 3.0))
    assert sorted(store.root["scores/t"].group_keys()) == ["v"]


def test_row_hashes_are_per_row_and_collation_independent():
    x = torch.arange(40.0).reshape(10, 4)
    y = torch.arange(10)
    h = row_hashes([x, y])
    assert h.dtype == np.uint64 and len(set(h.tolist())) == 10 and (h != 0).all()
    # a row's hash depends on that row only
    np.testing.assert_array_equal(row_hashes([x[3:7], y[3:7]]), h[3:7])
    np.testing.assert_array_equal(dataset_row_hashes(TensorDataset(x, y), block=3), h)
    x2 = x.clone()
    x2[5, 2] += 1
    assert (row_hashes([x2, y]) != h).tolist() == [i == 5 for i in range(10)]
    assert (row_hashes([x.double(), y]) != h).all()  # the dtype counts
    d = row_hashes({"input_ids": x.long(), "label": y})
    assert (d != row_hashes({"ids": x.long(), "label": y})).all()  # so do field names


def test_the_dataset_fingerprint_covers_every_row():
    """The old fingerprint sampled 64 of 1500 rows: row 777 was never read."""
    x, y = torch.randn(1500, 4), torch.zeros(1500, dtype=torch.int64)
    ref = dataset_fingerprint(TensorDataset(x, y))
    for row in (0, 777, 1499):
        x2 = x.clone()
        x2[row, 0] += 1e-3
        assert dataset_fingerprint(TensorDataset(x2, y)) != ref


def test_the_driver_names_the_changed_rows(store_path):
    spec = synthetic_spec(N, P, dtype="float32", chunk_rows=CHUNK)
    filled(store_path)
    hashes = np.arange(1, N + 1, dtype=np.uint64)
    hashes[[17, 60]] += 1000
    changed = type(spec)(**{**spec.to_json(), "dataset_fingerprint": "other"})
    with pytest.raises(StoreMismatchError, match="rows 17, 60 differ"):
        FeatureStore.create_or_open(store_path, changed, row_hashes=hashes)


def test_unreadable_metadata_is_found_and_named(store_path):
    filled(store_path)
    assert unreadable_metadata(store_path) == []
    meta = store_path / "train" / "0" / "Q" / "zarr.json"
    meta.write_bytes(meta.read_bytes()[:40])
    (store_path / "scores" / "zarr.json").write_text(json.dumps({"zarr_format": 3}))
    assert unreadable_metadata(store_path) == ["scores", "train/0/Q"]
    with pytest.raises(StoreStateError, match=r"train/0/Q/zarr.json .*trak-dist store repair"):
        FeatureStore.open(store_path)


def test_metadata_being_written_by_another_process_is_not_torn(store_path):
    """A concurrent TRAKer creating its staged group: the folder exists, its zarr.json is cut
    short for a moment, then whole. Opening the store meanwhile must not call it torn."""
    filled(store_path)
    node = store_path / "train" / "0" / "staged"
    node.mkdir()
    (node / "zarr.json").write_text('{"zarr_format": 3, "node_')
    whole = json.dumps({"zarr_format": 3, "node_type": "group", "attributes": {}})
    writer = threading.Timer(0.3, (node / "zarr.json").write_text, args=(whole,))
    writer.start()
    try:
        FeatureStore.open(store_path)
    finally:
        writer.join()
    assert unreadable_metadata(store_path) == []


def test_verify_and_repair(store_path):
    store = filled(store_path, ids=(0, 1))
    write_scores(store, "v", 1.0, 2, model_ids=(1,))
    write_scores(store, "u", 1.0, 2, model_ids=(0,))
    store.create_scores("t", "w", N, 3, 2, {"model_ids": [0]})  # left by a killed scoring
    (problem,) = verify(store_path).problems
    assert problem.node.startswith("scores/t/w.partial-") and "stopped" in problem.what

    flip(store_path / "train" / "1" / "X" / "c" / "1" / "0")
    (store_path / "train" / "1" / "H" / "c" / "3").unlink()
    report = verify(store_path)
    whats = {p.what for p in report.problems}
    assert (
        "train/1/X chunk 1 (rows [32, 64)) fails its checksum (its bytes changed on disk)" in whats
    )
    assert "train/1/H chunk 3 (rows [96, 100)) is missing, though committed" in whats
    _, actions = repair(store_path)
    assert "un-committed 2 chunk(s) of train/1 (rows [32, 64), [96, 100))" in actions
    assert any(a.startswith("dropped scores/t/w.partial-") for a in actions)
    assert "dropped train/1/xtx" in actions and "dropped scores/t/v" in actions
    assert store_path.joinpath("scores/t/u").is_dir()  # checkpoint 0's scores are kept
    after = FeatureStore.open(store_path)
    assert after.train_rows(1).done_chunks().tolist() == [True, False, True, False]
    assert after.train_rows(0).is_complete() and after.read_xtx(0) is not None
    assert not verify(store_path).problems


def test_checkpoints_of_different_items_are_not_repairable(store_path):
    store = filled(store_path, ids=(0, 1))
    rows = store.train_rows(1)
    rows.write(64, np.ones((N - 64, P)), np.ones(N - 64), np.arange(7, 7 + N - 64))
    (problem,) = verify(store_path).problems
    assert "different items" in problem.what and not problem.repairable
