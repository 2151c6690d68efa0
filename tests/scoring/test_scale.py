"""Scoring at scale (docs/design.md, "Scoring at scale"): exact top-k without S, one pass over X
per target super-block of the memory budget, block tasks that give the same bits however the
rows are split, and a scoring that resumes from its committed blocks."""

import dataclasses
import itertools
import math
import subprocess
import sys

import numpy as np
import pytest
import torch

from tests.fixtures.synthetic import synthetic_spec
from tests.scoring.test_blocks import dense
from trak_dist.errors import ConfigError, StoreStateError
from trak_dist.pipeline import Reducer
from trak_dist.scoring import ScorePlan, ScoreRequest, ScoringConfig, compute_scores, xtx_from_rows
from trak_dist.scoring._topk import block_topk, merge, merge_above
from trak_dist.store import FeatureStore
from trak_dist.store.verify import verify

N, M, P, CHUNK, K = 1200, 300, 24, 64, 7
DUPLICATES = [(5, 1100), (40, 41), (599, 1198)]  # (row, copy): equal scores, ties broken by row


def mid_store(path, ids=(0, 1)):
    """A mid-size store: n=1200 (some train rows duplicated: tied scores), m=300, p=24."""
    spec = synthetic_spec(N, P, dtype="float32", chunk_rows=CHUNK)
    store = FeatureStore.create_or_open(path, spec)
    rng = np.random.default_rng(1)
    store.ensure_experiment("t", M, None)
    data = {}
    for c in ids:
        x = rng.standard_normal((N, P)).astype(np.float32)
        q = rng.uniform(0.1, 1, N).astype(np.float32)
        for a, b in DUPLICATES:
            x[b], q[b] = x[a], q[a]
        xt = rng.standard_normal((M, P)).astype(np.float32)
        rows = store.ensure_checkpoint(c)
        rows.write(0, x, q)
        rows.commit(0, N)
        store.write_xtx(c, xtx_from_rows(rows, 0, N))
        trows = store.ensure_target_checkpoint("t", c)
        trows.write(0, xt)
        trows.commit(0, M)
        data[c] = (x.astype(np.float64), q.astype(np.float64), xt.astype(np.float64))
    return store, data


def exact_topk(s, k):
    """Top-k of each column of ``s`` [n, m] by (value descending, row ascending): numpy."""
    rows = np.arange(s.shape[0])
    idx = np.stack([np.lexsort((rows, -s[:, t]))[:k] for t in range(s.shape[1])])
    return idx, np.take_along_axis(s.T, idx, 1)


def request(**kw):
    base = {"train_block": 128, "target_block": 64, "topk": K}
    return ScoreRequest(ScoringConfig("t", **{**base, **kw}), (0, 1), P, 0.1)


def test_topk_only_equals_the_full_matrix_topk_and_a_dense_solve(store_path):
    store, data = mid_store(store_path)
    full = Reducer(store).score(request(write_scores="full", block_rows=256))
    s = store.score_set("t", full.variant).scores()
    top_full = store.score_set("t", full.variant).read_topk()
    only = Reducer(store).score(request(write_scores="topk", block_rows=512))
    sset = store.score_set("t", only.variant)
    assert (full.write_scores, only.write_scores) == ("full", "topk") and not sset.full
    top = sset.read_topk()
    for key in top:  # the same bits: top-k of the full matrix, whatever was written
        np.testing.assert_array_equal(top[key], top_full[key])
    idx, vals = exact_topk(s, K)
    np.testing.assert_array_equal(top["proponents_idx"], idx)
    np.testing.assert_array_equal(top["proponents_val"], vals)
    oidx, ovals = exact_topk(-s, K)
    np.testing.assert_array_equal(top["opponents_idx"], oidx)
    np.testing.assert_array_equal(top["opponents_val"], -ovals)
    # ties (duplicated rows) resolved to the lower row: the copy is never ranked first
    for a, b in DUPLICATES:
        np.testing.assert_array_equal(s[a], s[b])
        for t in range(M):
            row = list(top["proponents_idx"][t])
            if b in row:
                assert a in row and row.index(a) < row.index(b)
    ref = dense(data, P, 0.1)
    np.testing.assert_allclose(s, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())
    ref_vals = np.take_along_axis(ref.T, top["proponents_idx"], 1)
    np.testing.assert_allclose(
        top["proponents_val"], ref_vals, rtol=1e-5, atol=1e-5 * abs(ref).max()
    )
    with pytest.raises(StoreStateError, match="write_scores=full"):
        sset.scores()
    with pytest.raises(StoreStateError, match="read_topk"):
        sset.read_rows(0, 10)
    assert sset.shape == (N, M)
    # a top-k-only set is whole without S (the synthetic rows have no item hashes: not checked)
    assert not [p for p in verify(store_path).problems if p.node.startswith("scores")]


def test_auto_writes_s_only_below_full_max_bytes(store_path):
    store, _ = mid_store(store_path, ids=(0,))
    small = request(full_max_bytes=4 * N * M)
    big = request(full_max_bytes=4 * N * M - 1)
    one = dict(model_ids=(0,))
    assert Reducer(store).score(dataclasses.replace(small, **one)).write_scores == "full"
    assert Reducer(store).score(dataclasses.replace(big, **one)).write_scores == "topk"


@pytest.mark.parametrize("targets_per_pass", [64, 128, 300])
def test_x_is_read_once_per_super_block_of_the_budget(store_path, targets_per_pass):
    """A budget that fits ``targets_per_pass`` targets: ⌈m / that⌉ passes over X, counted in
    the bytes the blocks read, and the same top-k bits as one pass."""
    store, _ = mid_store(store_path)
    c, tb, trb = 2, 64, 128
    fixed = 4 * c * trb * P + 16 * trb * tb
    memory = fixed + targets_per_pass * (4 * c * P + 48 * K)
    plan = ScorePlan.of(
        N, M, P, c, ScoringConfig(topk=K, train_block=trb, target_block=tb, memory=memory)
    )
    assert plan.super_block == min(M, targets_per_pass)
    result = Reducer(store).score(request(memory=memory, write_scores="topk"))
    passes = math.ceil(M / plan.super_block)
    assert result.x_passes == passes and result.super_block == plan.super_block
    x_bytes = c * N * (P + 1) * 4  # X and Q of every checkpoint, float32
    y_bytes = c * M * P * 4  # each block reads its super-block's Y once
    ranges = math.ceil(N / plan.block_rows)
    merge_bytes = ranges * M * K * 24
    assert result.bytes_read == passes * x_bytes + ranges * y_bytes + merge_bytes
    one_pass = Reducer(store).score(request(write_scores="topk"))
    assert one_pass.x_passes == 1
    assert np.array_equal(result.top.proponents_idx, one_pass.top.proponents_idx)
    assert np.array_equal(result.top.opponents_val, one_pass.top.opponents_val)


def test_a_budget_below_one_block_is_a_clear_error():
    with pytest.raises(ConfigError, match=r"scoring.memory=1000 bytes .* needs \d+ bytes"):
        ScorePlan.of(
            N, M, P, 2, ScoringConfig(topk=K, train_block=128, target_block=64, memory=1000)
        )


def test_the_split_into_blocks_does_not_change_a_bit(store_path):
    store, _ = mid_store(store_path)
    settings = ScoringConfig("t", topk=K, train_block=128, target_block=64, write_scores="full")
    one = compute_scores(store, dataclasses.replace(settings, block_rows=N), [0, 1], P, 0.1)
    s1, t1 = one.scores(), one.read_topk()
    many = compute_scores(store, dataclasses.replace(settings, block_rows=128), [0, 1], P, 0.1)
    np.testing.assert_array_equal(many.scores(), s1)
    for key, v in many.read_topk().items():
        np.testing.assert_array_equal(v, t1[key])


def test_a_killed_scoring_resumes_from_its_committed_blocks(store_path):
    """Half the blocks run, then the scoring "dies" (its reducer is dropped without finishing):
    a new reducer's plan finds the unfinished set, runs only the other half, and publishes the
    same bits as an uninterrupted scoring."""
    store, _ = mid_store(store_path)
    req = request(write_scores="full", block_rows=256)
    clean = Reducer(store).score(req)
    s_clean = store.score_set("t", clean.variant).scores()
    top_clean = store.score_set("t", clean.variant).read_topk()
    first = Reducer(FeatureStore.open(store_path))
    tasks = first.prepare_scores([req])
    assert len(tasks) == clean.blocks == 5
    for task in tasks[:2]:
        first.run_block(task)
    del first
    again = Reducer(FeatureStore.open(store_path))
    left = again.prepare_scores([req])
    assert [(t.row_range, t.super_block) for t in left] == [
        (t.row_range, t.super_block) for t in tasks[2:]
    ]
    (result,) = again.finish_scores([req], [again.run_block(t) for t in left])
    assert (result.blocks_reused, result.blocks_computed) == (2, 3)
    sset = FeatureStore.open(store_path).score_set("t", result.variant)
    np.testing.assert_array_equal(sset.scores(), s_clean)
    for key, v in sset.read_topk().items():
        np.testing.assert_array_equal(v, top_clean[key])
    assert "parts" not in sset.group  # merged partials are dropped before publishing


def test_a_second_scoring_of_the_variant_fails_at_once_while_one_runs(store_path):
    """Two scorings of one variant would share its unfinished set (the second resuming it under
    the first, or removing it for another plan): while one holds the variant's lease, another
    process's scoring fails at once with the lock file named; after the publish it may."""
    store, _ = mid_store(store_path)
    req = request(write_scores="full", block_rows=256)
    first = Reducer(store)
    tasks = first.prepare_scores([req])
    second = [
        sys.executable,
        "-c",
        "import sys\n"
        "from trak_dist.errors import StoreStateError\n"
        "from trak_dist.pipeline import Reducer\n"
        "from trak_dist.scoring import ScoreRequest, ScoringConfig\n"
        "try:\n"
        f"    Reducer({str(store_path)!r}).prepare_scores([{req!r}])\n"
        "except StoreStateError as e:\n"
        "    sys.exit(str(e))\n",
    ]
    out = subprocess.run(second, capture_output=True, text=True, timeout=300)
    assert out.returncode == 1
    assert "another process is scoring 'p24_lambda0.1' of 't'" in out.stderr
    assert f"{store_path}.scoring-t-p24_lambda0.1.lock" in out.stderr
    with pytest.raises(StoreStateError, match="another process is scoring"):
        Reducer(FeatureStore.open(store_path)).prepare_scores([req])  # this process, too
    first.finish_scores([req], [first.run_block(t) for t in tasks])
    out = subprocess.run(second, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr


def test_merging_top_lists_in_any_order_or_split_gives_the_same_bits():
    g = torch.Generator().manual_seed(0)
    s = torch.randint(-20, 20, (500, 30), generator=g).float()  # many ties
    whole = block_topk(s, 0, 9)
    for cut in ([250], [1, 9, 300], list(range(50, 500, 50))):
        bounds = [0, *cut, 500]
        parts = [block_topk(s[a:b], a, 9) for a, b in itertools.pairwise(bounds)]
        for order in (parts, parts[::-1]):
            got = None
            for part in order:
                got = merge(got, part, 9)
            assert got is not None
            assert torch.equal(got[0], whole[0]) and torch.equal(got[1], whole[1])
    idx, _ = exact_topk(s.numpy(), 9)
    np.testing.assert_array_equal(whole[1].T.numpy(), idx)


@pytest.mark.parametrize("largest", [True, False])
@pytest.mark.parametrize("levels", [7, 40, 100_000])  # heavy ties … almost none
def test_selecting_only_entries_above_the_kth_gives_the_topk_bits(largest, levels):
    g = torch.Generator().manual_seed(levels)
    s = torch.randint(-levels, levels, (2000, 30), generator=g).float() / 3
    s[:, 0] = 1.0  # one column all equal: every entry ties with the k-th
    for step in (100, 40, 5):  # groups of GROUP rows and a short last one; fewer rows than k
        got = ref = None
        for a in range(0, 2000, step):
            got = merge_above(got, s[a : a + step], a, 9, largest)
            ref = merge(ref, block_topk(s[a : a + step], a, 9, largest), 9)
            assert torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1])
    assert got is not None
    idx, vals = exact_topk((s if largest else -s).numpy(), 9)
    np.testing.assert_array_equal(got[1].T.numpy(), idx)
    np.testing.assert_array_equal(got[0].T.numpy(), vals)


@pytest.mark.parametrize("name", ["", "a/b"])
def test_a_bad_exp_name_is_refused_when_the_config_is_made(name):
    from trak_dist.config import ScoringConfig

    with pytest.raises(ConfigError, match=r"scoring.exp_name=.*without '/'"):
        ScoringConfig(exp_name=name)
