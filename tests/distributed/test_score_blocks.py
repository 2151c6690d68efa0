"""Score blocks on Ray worker actors (docs/design.md, "Scoring at scale"): the same bits as the
in-process executor, a killed score worker replaced, a scoring stopped midway resumed from its
committed blocks. The store is featurised once (in-process); each Ray run rescores it."""

import dataclasses
import shutil

import numpy as np
import psutil
import pytest

from tests.fixtures.helpers import one_thread
from tests.fixtures.pipeline import LAMBDA, P, run_in_process, small_job
from trak_dist.distributed import run_job
from trak_dist.store import FeatureStore, variant_name

pytestmark = [pytest.mark.ray, pytest.mark.slow]
BLOCKS = 6  # 1500 train rows in ranges of 256, one super-block of 297 targets


def scoring_job(path, checkpoints):
    cfg = small_job(path, checkpoints, workers=2, shard_rows=256)
    scoring = dataclasses.replace(cfg.scoring, train_block=128, block_rows=256, write_scores="full")
    return dataclasses.replace(cfg, scoring=scoring)


def stored(cfg):
    sset = FeatureStore.open(cfg.store.path, mode="r").score_set("targets", variant_name(P, LAMBDA))
    return sset.scores(), sset.read_topk()


@pytest.fixture(scope="module")
def in_process(tmp_path_factory, digits_checkpoints):
    """The in-process run's store (one intra-op thread, as a Ray worker of one CPU) and scores."""
    cfg = scoring_job(tmp_path_factory.mktemp("here") / "s.zarr", digits_checkpoints)
    with one_thread():
        result = run_in_process(cfg)
    assert result.scores[0].blocks == result.scores[0].blocks_computed == BLOCKS
    return cfg, *stored(cfg)


@pytest.fixture
def copy(in_process, tmp_path):
    """A copy of the featurised store: a Ray run rescores it and must give the same bits."""
    cfg = in_process[0]
    shutil.copytree(cfg.store.path, tmp_path / "s.zarr")
    return dataclasses.replace(
        cfg, store=dataclasses.replace(cfg.store, path=str(tmp_path / "s.zarr"))
    )


def same(cfg, s, top):
    s_ray, top_ray = stored(cfg)
    np.testing.assert_array_equal(s_ray, s)
    for key, v in top.items():
        np.testing.assert_array_equal(top_ray[key], v)


def rescore(cfg):
    """Drop the copy's published scores: the next run scores again (featurisation reused)."""
    shutil.rmtree(f"{cfg.store.path}/scores")


def test_two_ray_workers_score_the_same_bits_as_in_process(ray_session, in_process, copy):
    _, s, top = in_process
    rescore(copy)
    workers = set()
    result = run_job(copy, on_block=lambda r: workers.add(r.worker))
    assert result.rows_computed == {"train": 0, "target": 0}
    sc = result.scores[0]
    assert (sc.blocks, sc.blocks_computed, sc.blocks_reused, sc.x_passes) == (BLOCKS, BLOCKS, 0, 1)
    assert len(workers) == 2
    same(copy, s, top)


def test_a_killed_score_worker_is_replaced_and_nothing_committed_is_redone(
    ray_session, in_process, copy
):
    _, s, top = in_process
    rescore(copy)
    killed = []

    def kill_once(result):
        if not killed:
            pid = int(result.worker.rsplit(":", 1)[1])
            psutil.Process(pid).kill()
            killed.append(pid)

    result = run_job(copy, on_block=kill_once)
    sc = result.scores[0]
    assert len(killed) == 1 and sc.worker_restarts == 1
    # the killed worker had finished its block: every block computed once, none lost
    assert (sc.blocks_computed, sc.blocks_reused) == (BLOCKS, 0)
    same(copy, s, top)


class Stop(Exception):
    pass


def test_a_scoring_stopped_midway_resumes_from_committed_blocks(ray_session, in_process, copy):
    _, s, top = in_process
    rescore(copy)
    done = []

    def stop_after_two(result):
        done.append(result)
        if len(done) == 2:
            raise Stop

    with pytest.raises(Stop):
        run_job(copy, on_block=stop_after_two)
    result = run_job(copy)
    sc = result.scores[0]
    # the two reported blocks, and any that committed while the driver stopped, are kept
    assert sc.blocks_reused >= 2 and sc.blocks_computed == BLOCKS - sc.blocks_reused
    same(copy, s, top)
