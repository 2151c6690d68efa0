"""Staged rows (issue 11) under the store's integrity rules (issue 10): they carry their item
hashes and checksums, a fold moves X, Q and H together and binds the checkpoint as a direct
commit does, only rows staged from the bound checkpoint are folded or reused, and
verify/repair understand them. Real Zarr stores, synthetic rows (tests/fixtures/row_writers.py)."""

import numpy as np
import pytest
from test_store import spec

from tests.fixtures.row_writers import P, item_hashes, row_values
from trak_dist.errors import ConfigError, StoreDamagedError, StoreMismatchError, StoreStateError
from trak_dist.store import FeatureStore
from trak_dist.store.verify import repair, verify

N, CHUNK = 200, 64  # chunks [0, 64), [64, 128), [128, 192), [192, 200)


def new_rows(path):
    store = FeatureStore.create_or_open(path, spec(proj_dim=P, train_size=N, chunk_rows=CHUNK))
    return store.ensure_checkpoint(0)


def write(rs, inds, writer, checkpoint=None, hashes=None):
    inds = np.asarray(inds)
    h = item_hashes(inds) if hashes is None else hashes
    return rs.staged.write_rows(inds, *row_values(inds), h=h, writer=writer, checkpoint=checkpoint)


def shadow_chunk(store_path, writer, array, *coords):
    return store_path.joinpath("train", "0", "staged", writer, array, "c", *map(str, coords))


def flip(path, offset=3):
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def test_a_fold_moves_x_q_and_h_together_and_binds_the_checkpoint(store_path):
    rs = new_rows(store_path)
    write(rs, np.arange(0, 40), "a", "ckpt")
    write(rs, np.arange(40, 64), "b", "ckpt")
    # before the fold, the staged rows' hashes are what a rerun compares its items with
    np.testing.assert_array_equal(
        rs.staged.recorded_hashes(np.arange(30, 50)), item_hashes(range(30, 50))
    )
    assert rs.staged.fold(np.array([0]), "ckpt") == 1
    x, q = row_values(np.arange(64))
    np.testing.assert_array_equal(rs.read(0, 64), x)
    np.testing.assert_array_equal(rs.read_q(0, 64), q)
    np.testing.assert_array_equal(
        rs.read_hashes(slice(0, 64), checked=True), item_hashes(range(64))
    )
    assert rs.checkpoint() == "ckpt"
    # bound by the fold's commit, exactly as by a direct one
    with pytest.raises(StoreMismatchError, match="different checkpoint"):
        FeatureStore.open(store_path).ensure_checkpoint(0, "other")
    report = verify(store_path)
    # chunk 0 is committed; the rows staged in it are leftovers no fold reads: not checked
    assert report.problems == [] and report.chunks_checked == 1


def test_a_staged_chunk_that_fails_its_checksum_stops_the_fold_and_repair_drops_that_shadow(
    store_path,
):
    rs = new_rows(store_path)
    write(rs, np.arange(0, 40), "a", "ckpt")
    write(rs, np.arange(40, 64), "b", "ckpt")
    write(rs, np.arange(64, 100), "b", "ckpt")
    flip(shadow_chunk(store_path, "a", "X", 0, 0))
    with pytest.raises(StoreDamagedError, match=r"staged/a/X chunk 0 .* fails its checksum"):
        rs.staged.fold(None, "ckpt")
    assert not rs.done_chunks().any()  # nothing was committed from damaged rows
    report = verify(store_path)
    assert [p.node for p in report.problems] == ["train/0/staged/a"]
    assert "staged/a/X chunk 0 (rows [0, 64)) fails its checksum" in report.problems[0].what
    _, actions = repair(store_path)
    assert actions == ["dropped train/0/staged/a"]
    assert verify(store_path).problems == []
    rs = FeatureStore.open(store_path).train_rows(0)
    # a's rows are to be featurised again; b's are kept
    assert np.flatnonzero(rs.staged.rows_done("ckpt")).tolist() == list(range(40, 100))
    write(rs, np.arange(0, 40), "c", "ckpt")
    assert rs.staged.fold(None, "ckpt") == 1
    np.testing.assert_array_equal(rs.read(0, 64), row_values(np.arange(64))[0])


def test_a_missing_staged_chunk_or_flags_is_reported(store_path):
    rs = new_rows(store_path)
    write(rs, np.arange(0, 40), "a", "ckpt")
    write(rs, np.arange(64, 70), "b", "ckpt")
    shadow_chunk(store_path, "a", "H", 0).unlink()  # flagged rows without their hashes
    flip(shadow_chunk(store_path, "b", "has", 1))
    report = verify(store_path)
    found = sorted((p.node, p.what.split(" (")[0]) for p in report.problems)
    assert found == [
        ("train/0/staged/a", "train/0/staged/a/H chunk 0"),
        ("train/0/staged/b", "train/0/staged/b/has chunk 1"),
    ]
    with pytest.raises(StoreDamagedError, match=r"staged/a/H chunk 0 .* is missing, though rows "):
        rs.staged.recorded_hashes(np.array([5]))


def test_rows_staged_from_another_checkpoint_are_neither_reused_nor_folded(store_path):
    wrong = new_rows(store_path)
    # a run on a wrong checkpoint staged rows, committed nothing (and is still running)
    write(wrong, np.arange(0, 50), "wrong", "W")
    assert wrong.checkpoint() == "W"
    # the right checkpoint is accepted (nothing committed) and sees none of those rows
    rs = FeatureStore.open(store_path).ensure_checkpoint(0, "F")
    assert not rs.staged.rows_done("F").any()
    assert rs.staged.recorded_hashes(np.array([3]), "F").tolist() == [0]
    write(rs, np.arange(10, 64), "right", "F")
    assert rs.staged.fold(None, "F") == 0  # rows 0..10 only the wrong run staged: chunk 0 not whole
    write(rs, np.arange(0, 10), "right", "F")
    assert rs.staged.fold(np.array([0]), "F") == 1
    assert rs.checkpoint() == "F"
    np.testing.assert_array_equal(rs.read(0, 64), row_values(np.arange(64))[0])
    # the wrong writer cannot commit its rows into the right checkpoint's set: not by a fold
    write(wrong, np.arange(64, 100), "wrong", "W")
    write(wrong, np.arange(100, 128), "wrong", "W")
    with pytest.raises(StoreMismatchError, match="different checkpoint"):
        wrong.staged.fold(None, "W")
    # nor directly, once it looks again
    with pytest.raises(StoreMismatchError, match="different checkpoint"):
        write(FeatureStore.open(store_path).train_rows(0), np.arange(128, 192), "wrong", "W")
    assert FeatureStore.open(store_path).train_rows(0).done_chunks().tolist() == [
        True, False, False, False
    ]  # fmt: skip


def test_one_row_staged_by_two_writers_from_different_items_is_refused(store_path):
    rs = new_rows(store_path)
    write(rs, np.arange(0, 40), "a")
    other = item_hashes(np.arange(30, 64))
    other[5] += np.uint64(1)  # row 35: another item
    write(rs, np.arange(30, 64), "b", hashes=other)
    with pytest.raises(
        StoreMismatchError, match="row 35: staged by two processes from different items"
    ):
        rs.staged.fold()


def test_repair_uncommits_whole_chunks_and_their_staged_leftovers(store_path):
    """A chunk committed by a writer of the whole chunk while another writer had staged some
    of its rows: repair of that chunk featurises all of its rows again, never the leftovers
    (verify never checked them: a fold does not read rows of committed chunks)."""
    rs = new_rows(store_path)
    write(rs, np.arange(0, 40), "a")
    write(rs, np.arange(0, 64), "b")  # whole: written and committed directly
    assert rs.done_chunks().tolist() == [True, False, False, False]
    flip(store_path / "train" / "0" / "X" / "c" / "0" / "0", offset=40)
    report = verify(store_path)
    assert [p.uncommit for p in report.problems] == [("train/0", 0)]
    repair(store_path)
    rs = FeatureStore.open(store_path).train_rows(0)
    assert not rs.staged.rows_done().any()
    assert verify(store_path).problems == []


def test_an_unreadable_commit_flag_is_rewritten_from_the_chunk_s_data(store_path):
    rs = new_rows(store_path)
    write(rs, np.arange(0, 64), "a")  # chunk 0 committed directly
    write(rs, np.arange(64, 100), "a")  # chunk 1: staged only
    rs.commit(64, 128)  # chunk 1's flag set although X holds none of it (a flipped flag)
    flip(store_path / "train" / "0" / "done" / "c" / "0", offset=0)
    flip(store_path / "train" / "0" / "done" / "c" / "1", offset=0)
    with pytest.raises(StoreDamagedError, match=r"train/0/done chunk 0 .* fails its checksum"):
        rs.done_chunks()
    report = verify(store_path)
    assert [(p.recommit, p.uncommit) for p in report.problems if "done" in p.node] == [
        (("train/0", 0), None),  # whole: its flag is rewritten
        (None, None),  # not whole: un-committed (the problems below)
    ]
    assert {p.uncommit for p in report.problems if p.uncommit} == {("train/0", 1)}
    repair(store_path)
    rs = FeatureStore.open(store_path).train_rows(0)
    assert rs.done_chunks().tolist() == [True, False, False, False]
    assert verify(store_path).problems == []


def test_torn_shadow_metadata_drops_only_that_shadow(store_path):
    rs = new_rows(store_path)
    write(rs, np.arange(0, 64), "a")
    write(rs, np.arange(64, 80), "a")
    write(rs, np.arange(80, 90), "b")
    meta = store_path / "train" / "0" / "staged" / "a" / "X" / "zarr.json"
    meta.write_bytes(meta.read_bytes()[:20])
    with pytest.raises(StoreStateError, match=r"staged/a/X/zarr.json"):
        FeatureStore.open(store_path)
    report = verify(store_path)
    assert {d for p in report.problems for d in p.drop} == {"train/0/staged/a"}
    repair(store_path)
    rs = FeatureStore.open(store_path).train_rows(0)
    assert rs.done_chunks()[0]  # the committed rows stay
    assert np.flatnonzero(rs.staged.staged_rows()).tolist() == list(range(80, 90))


def fisher_rows(inds: np.ndarray, draws: int) -> np.ndarray:
    """``[B, D, P]`` stand-in Fisher rows, exact in float16, distinct per row and draw."""
    x, _ = row_values(inds)
    return np.stack([x + 0.5 * (d + 1) for d in range(draws)], axis=1)


def test_fisher_rows_staged_by_several_writers_fold_with_x_and_damage_is_found(store_path):
    """TRAKer with the Fisher as K: G (one array per label draw) is staged beside X by each
    writer, folded with it into whole chunks, read back per draw, and checked by verify."""
    draws = 2
    store = FeatureStore.create_or_open(
        store_path,
        spec(proj_dim=P, train_size=N, chunk_rows=CHUNK, curvature="fisher", fisher_draws=draws),
    )
    rs = store.ensure_checkpoint(0)
    rng = np.random.default_rng(3)
    for k, batch in enumerate(np.array_split(rng.permutation(N), 7)):
        x, q = row_values(batch)
        g = fisher_rows(batch, draws)
        rs.staged.write_rows(
            batch, x, q, h=item_hashes(batch), writer=f"w{k % 3}", checkpoint="ckpt", g=g
        )
    with pytest.raises(ConfigError, match="Fisher"):  # G is given exactly when the set holds it
        rs.staged.write_rows(
            np.arange(3),
            *row_values(np.arange(3)),
            h=item_hashes(range(3)),
            writer="w9",
            checkpoint="ckpt",
        )
    assert verify(store_path).problems == []
    # a staged G chunk that fails its checksum is found before anything folds it
    shadow = next(p for p in store_path.joinpath("train", "0", "staged").iterdir() if p.is_dir())
    chunk = next(shadow.joinpath("G1", "c").rglob("*"))
    while chunk.is_dir():
        chunk = next(chunk.iterdir())
    good = chunk.read_bytes()
    flip(chunk)
    report = verify(store_path)
    assert [p.node for p in report.problems] == [f"train/0/staged/{shadow.name}"]
    assert f"staged/{shadow.name}/G1 chunk" in report.problems[0].what
    chunk.write_bytes(good)
    rs.staged.fold(None, "ckpt")
    assert rs.is_complete()
    inds = np.arange(N)
    want = fisher_rows(inds, draws).astype(np.float16)
    np.testing.assert_array_equal(rs.read_gs(0, N), want)
    np.testing.assert_array_equal(rs.read(0, N), row_values(inds)[0])
