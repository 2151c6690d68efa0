import dataclasses
import os

import numpy as np
import pytest
import torch

from tests.fixtures.synthetic import synthetic_spec
from trak_dist.errors import ConfigError, StoreMismatchError, StoreStateError
from trak_dist.remote import is_url
from trak_dist.store import (
    FeatureSpec,
    FeatureStore,
    checkpoint_fingerprint,
    dataset_fingerprint,
    store_lock,
)
from trak_dist.store.verify import verify


def spec(**kw):
    base = dict(
        proj_dim=64,
        projection="rademacher",
        seed=0,
        grad_wrt=None,
        model_output="trak_dist.tasks._classification:ImageClassification",
        grad_dim=1000,
        train_size=1000,
        dataset_fingerprint="abc",
        dtype="float16",
        chunk_rows=128,
    )
    base.update(kw)
    return FeatureSpec(**base)


def test_metadata_roundtrip_and_mismatch(store_path):
    FeatureStore.create_or_open(store_path, spec())
    reopened = FeatureStore.open(store_path)
    assert reopened.spec == spec()
    # a smaller proj_dim is served by the prefix
    FeatureStore.create_or_open(store_path, spec(proj_dim=32))
    for change in (
        dict(proj_dim=128),
        dict(seed=1),
        dict(grad_wrt=("fc.weight",)),
        dict(dtype="float32"),
        dict(projection="normal"),
        dict(train_size=999),
        dict(chunk_rows=64),
    ):
        with pytest.raises(StoreMismatchError) as e:
            FeatureStore.create_or_open(store_path, spec(**change))
        field = next(iter(change))
        assert field in str(e.value) and "new store path" in str(e.value)


def test_a_mismatch_lists_every_setting_and_reads_on_one_line():
    """Each differing setting on its own line, ended by ``;`` or ``.``: the command line prints
    the message on one line (``failures.exit_on``), where the items must still read apart."""
    with pytest.raises(StoreMismatchError) as e:
        spec(seed=1, proj_dim=128).check_compatible(spec(), "s.zarr")
    assert (
        "the store at s.zarr was written with different settings:\n"
        "  - proj_dim: store has 64, requested 128;\n"
        "  - seed: store has 0, requested 1.\n"
        "Use a new store path"
    ) in str(e.value)
    spec(proj_dim=32).check_compatible(spec(), "s.zarr")  # a smaller p: the stored prefix


def test_the_train_set_is_bound_by_what_was_committed(store_path):
    """Like checkpoints: while no train row is committed, other data takes the store over (a run
    stopped by a bad row, rerun with the row fixed); once rows are, it is refused, by name."""
    FeatureStore.create_or_open(store_path, spec()).ensure_checkpoint(0, "fp0")
    store = FeatureStore.create_or_open(store_path, spec(dataset_fingerprint="fixed"))
    assert store.spec.dataset_fingerprint == "fixed"
    assert FeatureStore.open(store_path).spec.dataset_fingerprint == "fixed"
    # another setting with it is refused as before, naming it, and rebinds nothing
    with pytest.raises(StoreMismatchError, match="seed: store has 0, requested 1"):
        FeatureStore.create_or_open(store_path, spec(dataset_fingerprint="x", seed=1))
    assert FeatureStore.open(store_path).spec.dataset_fingerprint == "fixed"
    rows = store.ensure_checkpoint(0, "fp0")
    rows.write(0, np.ones((128, 64), np.float32), np.ones(128, np.float32), np.ones(128, np.uint64))
    rows.commit(0, 128)
    with pytest.raises(
        StoreMismatchError, match="dataset_fingerprint: store has 'fixed', requested 'again'"
    ):
        FeatureStore.create_or_open(store_path, spec(dataset_fingerprint="again"))
    assert FeatureStore.open(store_path).spec.dataset_fingerprint == "fixed"


def test_with_row_hashes_only_committed_rows_bind_the_train_set(store_path):
    """The pipeline hashes every row: rows not committed yet may change (fixed data after a run
    that stopped), a committed one may not, and the error names it."""
    old = np.arange(1, 1001, dtype=np.uint64)
    FeatureStore.create_or_open(store_path, spec(), row_hashes=old)
    rows = FeatureStore.open(store_path).ensure_checkpoint(0, "fp0")
    rows.write(128, np.ones((128, 64), np.float32), np.ones(128, np.float32), old[128:256])
    rows.commit(128, 256)
    rows.write(0, np.ones((128, 64), np.float32), np.ones(128, np.float32), old[:128])  # no commit
    fixed = old.copy()
    fixed[7] = 99_999  # row 7: written, never committed (its run stopped)
    store = FeatureStore.create_or_open(store_path, spec(dataset_fingerprint="f"), row_hashes=fixed)
    assert store.spec.dataset_fingerprint == "f"
    changed = fixed.copy()
    changed[200] = 77_777  # committed
    with pytest.raises(StoreMismatchError, match=r"row 200 differs"):
        FeatureStore.create_or_open(store_path, spec(dataset_fingerprint="g"), row_hashes=changed)
    assert FeatureStore.open(store_path).spec.dataset_fingerprint == "f"


def test_spec_validation_names_the_field():
    with pytest.raises(ConfigError, match="proj_dim=0"):
        spec(proj_dim=0)
    with pytest.raises(ConfigError, match="dtype='bfloat16'"):
        spec(dtype="bfloat16")


def test_foreign_directory_is_refused(tmp_path):
    import zarr

    zarr.open_group(tmp_path / "other.zarr", mode="a").create_array("x", shape=(2,), dtype="f4")
    with pytest.raises(StoreMismatchError, match="did not write"):
        FeatureStore.create_or_open(tmp_path / "other.zarr", spec())


def test_chunk_aligned_writes_commits_and_pending(store_path):
    store = FeatureStore.create_or_open(store_path, spec())
    rows = store.ensure_checkpoint(0, "fp0")
    assert rows.n_chunks == 8  # 1000 rows / 128, last chunk partial
    assert list(rows.pending_ranges(300)) == [(0, 256), (256, 512), (512, 768), (768, 1000)]
    x = np.random.default_rng(0).standard_normal((256, 64)).astype(np.float32)
    rows.write(256, x, np.ones(256, np.float32))
    rows.commit(256, 512)
    tail = np.ones((1000 - 896, 64), np.float32)
    rows.write(896, tail)
    rows.commit(896, 1000)
    assert list(rows.done_chunks()) == [0, 0, 1, 1, 0, 0, 0, 1]
    assert list(rows.pending_ranges(10_000)) == [(0, 256), (512, 896)]
    np.testing.assert_array_equal(rows.read(256, 512), x.astype(np.float16))
    with pytest.raises(ConfigError, match="not aligned"):
        rows.write(100, x)
    with pytest.raises(ConfigError, match="not aligned"):
        rows.commit(0, 200)


def test_checkpoint_fingerprint_guards_model_ids(store_path):
    store = FeatureStore.create_or_open(store_path, spec())
    rows = store.ensure_checkpoint(3, "aaa")
    store.bind(rows, "aaa", "model_id=3")
    rows.write(0, np.ones((128, 64), np.float32), np.ones(128, np.float32), np.ones(128, np.uint64))
    rows.commit(0, 128)
    store.ensure_checkpoint(3, "aaa")
    with pytest.raises(StoreMismatchError, match="model_id=3"):
        store.ensure_checkpoint(3, "bbb")
    with pytest.raises(StoreMismatchError, match="different checkpoint"):
        FeatureStore.open(store_path).bind(rows, "bbb", "model_id=3")
    assert store.checkpoint_ids() == [3]
    with pytest.raises(StoreStateError, match="featurised checkpoints: \\[3\\]"):
        store.train_rows(4)


def test_a_checkpoint_is_bound_by_its_first_commit_not_before(store_path):
    """A run that failed before committing (a wrong checkpoint) does not lock out the fix."""
    store = FeatureStore.create_or_open(store_path, spec())
    rows = store.ensure_checkpoint(0, "wrong")
    store.bind(rows, "wrong", "model_id=0")  # bound, then the run failed: nothing committed
    again = FeatureStore.open(store_path)
    rows = again.ensure_checkpoint(0, "right")
    again.bind(rows, "right", "model_id=0")
    rows.write(0, np.ones((128, 64), np.float32), np.ones(128, np.float32), np.ones(128, np.uint64))
    rows.commit(0, 128)
    assert FeatureStore.open(store_path).root["train/0"].attrs["checkpoint"] == "right"
    with pytest.raises(StoreMismatchError, match="model_id=0"):
        FeatureStore.open(store_path).ensure_checkpoint(0, "wrong")


def test_experiments_and_missing_store(store_path, tmp_path):
    store = FeatureStore.create_or_open(store_path, spec())
    store.ensure_experiment("val", 10, "f1")
    ts = store.ensure_target_checkpoint("val", 0)
    assert (ts.n, ts.proj_dim) == (10, 64)
    with pytest.raises(StoreMismatchError, match="new experiment name"):
        store.ensure_experiment("val", 11, "f1")
    with pytest.raises(StoreStateError, match="featurise the train set first"):
        FeatureStore.open(tmp_path / "nothing.zarr")


def test_rows_of_two_processes_never_share_a_chunk_file(store_path):
    """Each committed chunk is its own key: a chunk's data and its flag are separate files."""
    store = FeatureStore.create_or_open(store_path, spec())
    rows = store.ensure_checkpoint(0)
    rows.write(0, np.ones((128, 64), np.float32))
    rows.commit(0, 128)
    done_dir = os.path.join(store_path, "train", "0", "done", "c")
    assert sorted(os.listdir(done_dir)) == ["0"]


def test_fingerprints():
    a = [(torch.arange(3.0), 1), (torch.arange(3.0) + 1, 0)]
    b = [(torch.arange(3.0), 1), (torch.arange(3.0) + 2, 0)]
    assert dataset_fingerprint(a) == dataset_fingerprint(list(a))
    assert dataset_fingerprint(a) != dataset_fingerprint(b)
    assert dataset_fingerprint(a) != dataset_fingerprint(a[:1])
    sd = {"w": torch.ones(2, 2, dtype=torch.bfloat16)}
    assert checkpoint_fingerprint(sd) != checkpoint_fingerprint({"w": torch.zeros(2, 2)})
    assert dataclasses.replace(spec(), seed=2).seed == 2


def test_non_finite_rows_are_refused_before_anything_is_written(store_path):
    from trak_dist.errors import NonFiniteError

    store = FeatureStore.create_or_open(store_path, spec())
    rows = store.ensure_checkpoint(2)
    x = np.random.default_rng(0).standard_normal((128, 64)).astype(np.float32)
    x[17, 3] = np.nan
    with pytest.raises(NonFiniteError, match=r"train rows of model_id=2, rows \[17\]"):
        rows.write(0, x, np.ones(128, np.float32))
    q = np.ones(128, np.float32)
    q[5] = np.inf
    with pytest.raises(NonFiniteError, match=r"Q \(out-to-loss weights\).*rows \[133\]"):
        rows.write(128, np.zeros((128, 64), np.float32), q)
    # finite in float32, infinite as the store's float16: overflow, with its own advice
    big = np.full((128, 64), 1e5, np.float32)
    with pytest.raises(NonFiniteError, match=r"overflow the store's float16.*half_precision"):
        rows.write(256, big)
    store.ensure_experiment("val", 10, None)
    targets = store.ensure_target_checkpoint("val", 0)
    with pytest.raises(NonFiniteError, match=r"experiment 'val', model_id=0, rows \[1, 4\]"):
        targets.staged.write_rows(
            np.array([1, 4]),
            np.array([[np.inf] * 64, [np.nan] * 64], np.float32),
            h=np.array([11, 12], np.uint64),
            writer="w",
        )
    assert not rows.done_chunks().any() and not targets.done_chunks().any()
    assert not os.path.exists(os.path.join(store_path, "train", "2", "X", "c"))  # no chunk file
    assert not os.path.exists(os.path.join(store_path, "targets", "val", "0", "X", "c"))
    assert not targets.staged.staged_rows().any()  # nothing staged either


def test_a_file_url_is_the_local_directory(tmp_path):
    url = f"file://{tmp_path}/s.zarr"
    assert not is_url(url) and is_url("s3://b/s.zarr") and is_url("gs://b/s.zarr")
    store = FeatureStore.create_or_open(url, synthetic_spec(64, 4, chunk_rows=32))
    rows = store.ensure_checkpoint(0, "ck")
    store.bind(rows, "ck", "model_id=0")
    rows.write(0, np.ones((64, 4)), np.ones(64), np.arange(1, 65))
    rows.commit(0, 64)
    assert (tmp_path / "s.zarr" / "train" / "0" / "X").is_dir()
    assert FeatureStore.open(tmp_path / "s.zarr").train_rows(0).is_complete()
    assert verify(url).problems == []
    with store_lock(url):
        assert (tmp_path / "s.zarr.lock").exists()
