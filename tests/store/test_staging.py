"""Rows written by any process, in any order: staged per writer, folded into whole chunks."""

import multiprocessing as mp

import numpy as np
import pytest
from test_store import spec

from tests.fixtures.row_writers import P, item_hashes, row_values, write_share
from trak_dist.errors import ConfigError
from trak_dist.store import FeatureStore


def new_rows(path, n=1000, chunk_rows=64):
    store = FeatureStore.create_or_open(path, spec(proj_dim=P, train_size=n, chunk_rows=chunk_rows))
    return store.ensure_checkpoint(0)


def write(rs, inds, writer):
    inds = np.asarray(inds)
    return rs.staged.write_rows(inds, *row_values(inds), h=item_hashes(inds), writer=writer)


def test_whole_chunks_go_straight_to_x_and_the_rest_is_staged(store_path):
    rs = new_rows(store_path)
    touched = write(rs, np.arange(60, 200)[::-1], "a")  # any order; chunks 1 and 2 are whole
    assert touched.tolist() == [0, 3]
    assert np.flatnonzero(rs.done_chunks()).tolist() == [1, 2]
    assert np.flatnonzero(rs.staged.staged_rows()).tolist() == [*range(60, 64), *range(192, 200)]
    assert rs.staged.rows_done()[60:200].all() and rs.staged.rows_done().sum() == 140
    np.testing.assert_array_equal(rs.read(64, 192), row_values(np.arange(64, 192))[0])
    # a second writer completes chunk 3 together with the first: folded whole
    assert write(rs, np.arange(200, 256), "b").tolist() == [3]
    assert rs.staged.fold(np.array([0, 3])) == 1
    np.testing.assert_array_equal(rs.read(192, 256), row_values(np.arange(192, 256))[0])
    np.testing.assert_array_equal(rs.read_q(192, 256), row_values(np.arange(192, 256))[1])
    assert np.flatnonzero(rs.done_chunks()).tolist() == [1, 2, 3]
    assert np.flatnonzero(rs.staged.staged_rows()).tolist() == [*range(60, 64), *range(192, 256)]


def test_full_fold_commits_everything_and_drops_the_staging_area(store_path):
    rs = new_rows(store_path, n=200, chunk_rows=64)  # last chunk is short (8 rows)
    rng = np.random.default_rng(0)
    order = rng.permutation(200)
    for k, batch in enumerate(np.array_split(order, 9)):
        write(rs, batch, f"w{k % 3}")
    committed_directly = int(rs.done_chunks().sum())
    assert rs.staged.fold() == 4 - committed_directly
    assert rs.is_complete() and "staged" not in rs.group
    x, q = row_values(np.arange(200))
    np.testing.assert_array_equal(rs.read(0, 200), x)
    np.testing.assert_array_equal(rs.read_q(0, 200), q)


def test_incomplete_chunks_stay_staged_and_a_cut_short_writer_is_ignored(store_path):
    rs = new_rows(store_path)
    write(rs, np.arange(0, 50), "a")
    assert rs.staged.fold() == 0 and not rs.done_chunks().any()
    assert rs.staged.rows_done().sum() == 50
    # a writer killed while creating its shadow: its group exists, its flags do not
    rs.group["staged"].create_group("dead").create_array("X", shape=(1000, P), dtype="float16")
    assert rs.staged.rows_done().sum() == 50
    # rows already committed whole by a chunk owner (a pipeline worker) are never refolded
    rs.write(0, *row_values(np.arange(64)), item_hashes(np.arange(64)))
    rs.commit(0, 64)
    assert rs.staged.fold(np.array([0])) == 0


def test_bad_row_indices_are_clear_errors(store_path):
    rs = new_rows(store_path)
    with pytest.raises(ConfigError, match="repeat"):
        write(rs, [3, 3], "a")
    with pytest.raises(ConfigError, match=r"\[0, 1000\)"):
        write(rs, [999, 1000], "a")
    with pytest.raises(ConfigError, match="integers"):
        rs.staged.write_rows(
            np.array([0.5]), *row_values(np.array([0])), h=item_hashes([0]), writer="a"
        )


@pytest.mark.slow
def test_three_processes_writing_interleaved_rows_lose_nothing(store_path):
    """The Zarr rule: writers that share chunks lose rows. Here three real processes write
    interleaved rows (row r by process r % 3) in shuffled batches of 9, so every chunk is
    shared by all three, folding whenever the lock is free; every row must arrive intact."""
    n = 960
    new_rows(store_path, n=n, chunk_rows=64)
    rng = np.random.default_rng(1)
    shares = []
    for w in range(3):
        mine = rng.permutation(np.arange(w, n, 3))
        shares.append([b.tolist() for b in np.array_split(mine, len(mine) // 9)])
    ctx = mp.get_context("spawn")
    procs = [
        ctx.Process(target=write_share, args=(str(store_path), share, f"p{w}"))
        for w, share in enumerate(shares)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=300)
        assert p.exitcode == 0
    rs = FeatureStore.open(store_path).train_rows(0)
    assert rs.staged.rows_done().all()
    rs.staged.fold()
    assert rs.is_complete()
    x, q = row_values(np.arange(n))
    np.testing.assert_array_equal(rs.read(0, n), x)
    np.testing.assert_array_equal(rs.read_q(0, n), q)
