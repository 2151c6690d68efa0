"""The store half of issue 10's fault matrix, run as a user runs trak_dist: real Zarr stores on
disk (a size-limited tmpfs for the full-disk cases), real Ray, real damage (bytes overwritten,
files deleted or cut short, a train row changed, a wrong checkpoint file), then the same
command again (or `trak-dist store repair` first, as the error says).

Each case ends in one of two outcomes, and nothing else:
- a clear error (its type and the words that tell the user what happened and what to do), or
- scores equal to a clean run's (max |ΔS| ≤ 1e-5 · max |S|), finite, with exactly the damaged
  rows featurised again.

Two entry points, as users have them: ``TRAKer`` (single process: most store cases, fast) and
the pipeline (``run_job`` on real Ray, the ``trak-dist`` CLI): what only the pipeline does
(workers reusing committed rows, the driver's fingerprint, exit codes) runs there, marked slow.

Rerun: ``.venv/bin/python -m pytest tests/faults/test_store_faults.py -v`` (``-m "not slow"``
for the quick half). The full-disk cases mount a tmpfs and need root (they skip, saying so,
without it).
"""

from __future__ import annotations

import dataclasses
import errno
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.fixtures.synthetic import synthetic_spec
from trak_dist import TRAKer
from trak_dist.config import (
    ClusterConfig,
    DataConfig,
    FeaturizeConfig,
    JobConfig,
    ModelConfig,
    ScoringConfig,
    StoreConfig,
)
from trak_dist.distributed import run_job
from trak_dist.errors import (
    NonFiniteError,
    StoreDamagedError,
    StoreMismatchError,
    StoreStateError,
)
from trak_dist.examples import digits
from trak_dist.store import FeatureStore, variant_name
from trak_dist.store import main as store_cli

P, LAMBDA, CHUNK, SHARD = 32, 1e-2, 128, 256
N, M = digits.N_TRAIN, 1797 - digits.N_TRAIN
VARIANT = variant_name(P, LAMBDA)
CLI = [sys.executable, "-c", "from trak_dist.cli import main; main()"]


def job(store: Path, checkpoints: list[Path], **sections) -> JobConfig:
    base = JobConfig(
        proj_dim=P,
        lambda_reg=LAMBDA,
        model=ModelConfig(checkpoints=[str(c) for c in checkpoints]),
        featurize=FeaturizeConfig(micro_batch=64, shard_rows=SHARD, max_task_retries=0),
        store=StoreConfig(path=str(store), chunk_rows=CHUNK),
        cluster=ClusterConfig(num_workers=1),
        progress=False,
        report=None,
    )
    return dataclasses.replace(base, **sections)


def cli_args(store: Path, checkpoints: list[Path], tmp: Path) -> list[str]:
    """The same job as ``job()`` on the command line."""
    return [
        f"store.path={store}",
        f"proj_dim={P}",
        f"lambda_reg={LAMBDA}",
        f"store.chunk_rows={CHUNK}",
        f"featurize.shard_rows={SHARD}",
        "featurize.micro_batch=64",
        "featurize.max_task_retries=0",
        f"model.checkpoints=[{','.join(str(c) for c in checkpoints)}]",
        "progress=false",
        f"hydra.run.dir={tmp / 'out'}",
    ]


def run_cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    return subprocess.run(
        [*CLI, *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=300
    )


def stored_scores(store: Path) -> np.ndarray:
    sset = FeatureStore.open(store, mode="r").score_set("targets", VARIANT)
    assert sset is not None
    return sset.scores()


def assert_clean(scores: np.ndarray, reference: np.ndarray) -> None:
    assert np.isfinite(scores).all()
    bound = 1e-5 * np.abs(reference).max()
    assert np.abs(scores - reference).max() <= bound


@pytest.fixture(scope="module")
def clean(ray_session, tmp_path_factory, digits_checkpoints):
    """A clean run's store and scores; cases start from a copy of it."""
    store = tmp_path_factory.mktemp("clean") / "s.zarr"
    result = run_job(job(store, digits_checkpoints, cluster=ClusterConfig(num_workers=2)))
    assert result.rows_computed == {"train": 2 * N, "target": 2 * M}
    return store, stored_scores(store)


@pytest.fixture
def copy(clean, tmp_path) -> Path:
    """A copy of the clean store, for one case to damage."""
    store = tmp_path / "s.zarr"
    shutil.copytree(clean[0], store)
    return store


def chunk_file(store: Path, array: str, *coords: int) -> Path:
    return store / array / "c" / "/".join(str(c) for c in coords)


# ---- TRAKer --------------------------------------------------------------------------------


class UserLoop:
    """A TRAKer user's script (featurise in batches, finalise, score), rerun after each fault;
    counts the rows it actually featurised."""

    def __init__(self, save_dir: Path, checkpoints: list[Path]) -> None:
        self.save_dir = save_dir
        self.states = [torch.load(c, weights_only=True) for c in checkpoints]
        self.train = digits.train_set().tensors
        self.targets = digits.target_set().tensors
        self.featurised = {"train": 0, "target": 0}

    def traker(self) -> TRAKer:
        t = TRAKer(
            model=digits.make_model(),
            task="image_classification",
            train_set_size=N,
            save_dir=self.save_dir,
            device="cpu",
            proj_dim=P,
            lambda_reg=LAMBDA,
            logging_level=logging.ERROR,
            chunk_rows=CHUNK,
        )
        project, featurize = t.featurizer.project, t.featurizer.featurize
        inside = []  # featurize calls project: count those rows as train rows only

        def counted_featurize(batch, model_id):
            self.featurised["train"] += len(batch[0])
            inside.append(1)
            try:
                return featurize(batch, model_id)
            finally:
                inside.pop()

        def counted_project(batch, model_id):
            if not inside:
                self.featurised["target"] += len(batch[0])
            return project(batch, model_id)

        t.featurizer.project = counted_project  # type: ignore[method-assign]
        t.featurizer.featurize = counted_featurize  # type: ignore[method-assign]
        return t

    def features(self, t: TRAKer) -> None:
        x, y = self.train
        for i, st in enumerate(self.states):
            t.load_checkpoint(st, model_id=i)
            for b in range(0, N, 500):
                t.featurize([x[b : b + 500], y[b : b + 500]], num_samples=min(500, N - b))

    def scores(self, t: TRAKer) -> np.ndarray:
        t.finalize_features()
        for i, st in enumerate(self.states):
            t.start_scoring_checkpoint("targets", st, model_id=i, num_targets=M)
            t.score(list(self.targets), num_samples=M)
        return np.asarray(t.finalize_scores("targets"))

    def run(self) -> np.ndarray:
        self.featurised = {"train": 0, "target": 0}
        t = self.traker()
        self.features(t)
        return self.scores(t)


@pytest.fixture(scope="module")
def traker_clean(tmp_path_factory, digits_checkpoints):
    loop = UserLoop(tmp_path_factory.mktemp("traker") / "s.zarr", digits_checkpoints)
    return loop.save_dir, loop.run()


@pytest.fixture
def user(traker_clean, tmp_path, digits_checkpoints) -> UserLoop:
    """A copy of the clean TRAKer store and the user script that made it."""
    shutil.copytree(traker_clean[0], tmp_path / "s.zarr")
    return UserLoop(tmp_path / "s.zarr", digits_checkpoints)


def test_traker_deleted_chunk_then_repair(user, traker_clean):
    """A committed chunk file deleted (before: read as zeros, scores off by 14 % of max|S|)."""
    chunk_file(user.save_dir, "train/1/Q", 5).unlink()
    with pytest.raises(
        StoreDamagedError, match=r"train/1/Q chunk 5 \(rows \[640, 768\)\) is missing"
    ):
        user.run()
    assert_clean(stored_scores(user.save_dir), traker_clean[1])  # the failed rescoring kept them
    assert store_cli(["verify", str(user.save_dir)]) == 1
    assert store_cli(["repair", str(user.save_dir)]) == 0
    assert store_cli(["verify", str(user.save_dir)]) == 0
    assert_clean(user.run(), traker_clean[1])
    assert user.featurised == {"train": CHUNK, "target": 0}  # exactly the damaged chunk


def test_traker_flipped_bytes_in_a_target_chunk(user, traker_clean):
    path = chunk_file(user.save_dir, "targets/targets/0/X", 1, 0)
    data = bytearray(path.read_bytes())
    data[100] ^= 0x01  # one bit
    path.write_bytes(bytes(data))
    with pytest.raises(
        StoreDamagedError, match=r"targets/targets/0/X chunk 1 .* fails its checksum"
    ):
        user.run()
    assert store_cli(["repair", str(user.save_dir)]) == 0
    assert_clean(user.run(), traker_clean[1])
    assert user.featurised == {"train": 0, "target": CHUNK}


def test_traker_damaged_xtx_is_recomputed(user, traker_clean):
    """XᵀX is derived from checksummed rows: damaged, it is rebuilt from them, unasked."""
    path = chunk_file(user.save_dir, "train/1/xtx", 0, 0)
    data = bytearray(path.read_bytes())
    data[10] ^= 0xFF
    path.write_bytes(bytes(data))
    shutil.rmtree(user.save_dir / "train" / "1" / "factor")
    assert_clean(user.run(), traker_clean[1])
    assert user.featurised == {"train": 0, "target": 0}


def truncate(path: Path) -> None:
    text = path.read_bytes()
    path.write_bytes(text[: len(text) // 2])


def test_traker_truncated_array_metadata(user, traker_clean):
    """(before: a raw JSONDecodeError traceback naming no file)"""
    truncate(user.save_dir / "train" / "0" / "X" / "zarr.json")
    with pytest.raises(StoreStateError, match=r"train/0/X/zarr.json") as e:
        user.run()
    assert f"trak-dist store repair {user.save_dir}" in str(e.value)
    assert store_cli(["repair", str(user.save_dir)]) == 0
    assert_clean(user.run(), traker_clean[1])
    assert user.featurised == {"train": N, "target": 0}  # its checkpoint binding was lost


def test_traker_truncated_reduction_metadata(user, traker_clean):
    truncate(user.save_dir / "train" / "1" / "xtx" / "zarr.json")
    with pytest.raises(StoreStateError, match=r"train/1/xtx/zarr.json"):
        user.run()
    assert store_cli(["repair", str(user.save_dir)]) == 0
    assert_clean(user.run(), traker_clean[1])
    assert user.featurised == {"train": 0, "target": 0}


def test_traker_rerun_with_a_changed_row_is_refused(user):
    """TRAKer users pass their own dataset_fingerprint (default "unspecified"): the rows of a
    batch that were featurised before are checked against their stored hashes."""
    x, y = user.train
    x = x.clone()
    x[42, 3] += 1.0
    user.train = (x, y)
    with pytest.raises(StoreMismatchError, match="row 42 differ"):
        user.run()


def test_traker_checkpoints_featurised_from_different_data_are_refused(
    tmp_path, digits_checkpoints
):
    """Checkpoint 1 featurised from a train set changed in one row: scoring refuses to mix."""
    user = UserLoop(tmp_path / "s.zarr", digits_checkpoints)
    t = user.traker()
    x, y = user.train
    t.load_checkpoint(user.states[0], model_id=0)
    t.featurize([x, y], num_samples=N)
    x = x.clone()
    x[1000, 0] += 1.0
    t.load_checkpoint(user.states[1], model_id=1)
    t.featurize([x, y], num_samples=N)
    with pytest.raises(StoreMismatchError, match=r"model_id=1 and model_id=0 .* row 1000"):
        user.scores(t)


def killed_after(user: UserLoop, rows: int) -> str:
    """A TRAKer process featurising checkpoint 0 in batches of 500 that stopped after ``rows``
    rows: the rows of its last, partly filled chunk are still staged. Returns its writer name."""
    t = user.traker()
    x, y = user.train
    t.load_checkpoint(user.states[0], model_id=0)
    for b in range(0, rows, 500):
        t.featurize([x[b : b + 500], y[b : b + 500]], num_samples=min(500, rows - b))
    return t._writer


def test_traker_staged_row_changed_in_the_dataset_is_refused(tmp_path, digits_checkpoints):
    """Rows a killed process left staged (not yet folded into X) are reused by the next one
    only if its items hash as theirs did."""
    user = UserLoop(tmp_path / "s.zarr", digits_checkpoints)
    killed_after(user, 1000)  # rows [896, 1000) of chunk 7 are staged
    rows = FeatureStore.open(user.save_dir).train_rows(0)
    assert not rows.done_chunks()[7] and rows.staged.staged_rows()[896:1000].all()
    x, y = user.train
    x = x.clone()
    x[950, 5] += 1.0
    user.train = (x, y)
    with pytest.raises(StoreMismatchError, match="row 950 differs"):
        user.run()


def test_traker_damaged_staging_array_then_repair(tmp_path, digits_checkpoints, traker_clean):
    """A byte flipped in a killed process's staged rows: the fold that needs them stops,
    naming the staged chunk; verify reports it, repair drops that writer's shadow, and the
    rerun featurises exactly its rows again and gives the clean scores."""
    user = UserLoop(tmp_path / "s.zarr", digits_checkpoints)
    writer = killed_after(user, 1000)
    flip_at = chunk_file(user.save_dir, f"train/0/staged/{writer}/X", 7, 0)
    data = bytearray(flip_at.read_bytes())
    data[64] ^= 0x01
    flip_at.write_bytes(bytes(data))
    with pytest.raises(
        StoreDamagedError, match=rf"train/0/staged/{writer}/X chunk 7 .* fails its checksum"
    ):
        user.run()
    assert user.featurised["train"] == 500  # rows [1000, 1500) staged or committed, then the fold
    assert store_cli(["verify", str(user.save_dir)]) == 1
    assert store_cli(["repair", str(user.save_dir)]) == 0
    assert store_cli(["verify", str(user.save_dir)]) == 0
    assert_clean(user.run(), traker_clean[1])
    # the dropped rows [896, 1000) of checkpoint 0, and checkpoint 1, which the failed run never
    # reached
    assert user.featurised == {"train": 104 + N, "target": 2 * M}
    assert not (user.save_dir / "train" / "0" / "staged").exists()  # all folded


# ---- the pipeline (real Ray) ----------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.ray
def test_random_bytes_in_a_committed_chunk(copy, clean, digits_checkpoints, tmp_path):
    """4 KiB of random bytes over a committed X chunk (before: rc 0, NaN and wrong rows)."""
    path = chunk_file(copy, "train/0/X", 2, 0)
    data = bytearray(path.read_bytes())
    data[:4096] = np.random.default_rng(0).bytes(4096)
    path.write_bytes(bytes(data))

    out = run_cli(cli_args(copy, digits_checkpoints, tmp_path), tmp_path)
    assert out.returncode == 2
    assert "train/0/X chunk 2 (rows [256, 384)) fails its checksum" in out.stderr
    assert f"trak-dist store repair {copy}" in out.stderr

    verify = run_cli(["store", "verify", str(copy)], tmp_path)
    assert verify.returncode == 1
    assert "train/0/X chunk 2 (rows [256, 384)) fails its checksum" in verify.stdout
    repair = run_cli(["store", "repair", str(copy)], tmp_path)
    assert repair.returncode == 0, repair.stdout + repair.stderr
    assert "un-committed 1 chunk(s) of train/0 (rows [256, 384))" in repair.stdout
    assert run_cli(["store", "verify", str(copy)], tmp_path).returncode == 0

    result = run_job(job(copy, digits_checkpoints))
    assert result.rows_computed == {"train": CHUNK, "target": 0}  # exactly the damaged chunk
    assert_clean(stored_scores(copy), clean[1])


@pytest.mark.slow
@pytest.mark.ray
def test_a_damaged_chunk_met_while_rebuilding_xtx_is_featurised_again(
    copy, clean, digits_checkpoints, caplog
):
    """No XᵀX yet (a reduce that never finished): the worker that reads the chunk back for its
    partial XᵀX featurises it again in place, without being asked."""
    shutil.rmtree(copy / "train" / "0" / "xtx")
    shutil.rmtree(copy / "train" / "0" / "factor")
    chunk_file(copy, "train/0/X", 7, 0).unlink()
    result = run_job(job(copy, digits_checkpoints))
    assert result.rows_computed == {"train": CHUNK, "target": 0}
    # checkpoint 0's other chunks, and every row of checkpoint 1 (its XᵀX is intact)
    assert result.rows_reused["train"] == (N - CHUNK) + N
    assert_clean(stored_scores(copy), clean[1])


# ---- torn metadata -------------------------------------------------------------------------


@pytest.mark.ray
def test_truncated_array_metadata(copy, digits_checkpoints):
    """The driver names the file before starting anything (repair and rerun: TRAKer case)."""
    truncate(copy / "train" / "0" / "X" / "zarr.json")
    with pytest.raises(StoreStateError, match=r"train/0/X/zarr.json") as e:
        run_job(job(copy, digits_checkpoints))
    assert f"trak-dist store repair {copy}" in str(e.value)


@pytest.mark.ray
def test_truncated_root_metadata(copy, digits_checkpoints):
    truncate(copy / "zarr.json")
    with pytest.raises(StoreStateError, match=r"root metadata .*zarr.json is unreadable") as e:
        run_job(job(copy, digits_checkpoints))
    assert "new store path" in str(e.value)
    assert store_cli(["repair", str(copy)]) == 2


@pytest.mark.ray
def test_a_store_of_format_1_is_refused(copy, digits_checkpoints):
    import json

    meta = json.loads((copy / "zarr.json").read_text())
    meta["attributes"]["trak_dist"]["spec"]["format_version"] = 1
    (copy / "zarr.json").write_text(json.dumps(meta))
    with pytest.raises(
        StoreMismatchError, match="store of format 1; this trak_dist reads format 2"
    ):
        run_job(job(copy, digits_checkpoints))


# ---- stale inputs --------------------------------------------------------------------------


def changed_train(row: int):
    """The digits train set with one pixel of one row changed (pickled by value for workers)."""

    def train_set():
        ds = digits.train_set()
        x, y = ds.tensors
        x = x.clone()
        x[row, 10] += 0.5
        return torch.utils.data.TensorDataset(x, y)

    return train_set


@pytest.mark.ray
def test_a_changed_train_row_is_refused(copy, clean, digits_checkpoints):
    """(before: the fingerprint sampled 64 rows; row 777 changed reused the old features)"""
    cfg = job(copy, digits_checkpoints)
    changed = dataclasses.replace(cfg, data=DataConfig(train=changed_train(777)))
    with pytest.raises(StoreMismatchError, match=r"row 777 differ"):
        run_job(changed)


@pytest.mark.slow
@pytest.mark.ray
def test_a_changed_train_row_under_a_user_fingerprint_is_refused_when_reused(
    ray_session, tmp_path, digits_checkpoints
):
    """A fingerprint given by the user is trusted up front; the rows are still checked against
    their stored hashes when a rerun reads them back (here: the reduce had not finished)."""
    store = tmp_path / "s.zarr"
    cfg = job(store, digits_checkpoints, data=DataConfig(train_fingerprint="my-data-v1"))
    run_job(cfg)
    shutil.rmtree(store / "train" / "0" / "xtx")
    changed = dataclasses.replace(
        cfg, data=DataConfig(train=changed_train(1234), train_fingerprint="my-data-v1")
    )
    with pytest.raises(Exception, match=r"row 1234 differ") as e:
        run_job(changed)
    assert isinstance(e.value, StoreMismatchError) or "StoreMismatchError" in str(e.value)


@pytest.mark.slow
@pytest.mark.ray
def test_wrong_then_fixed_checkpoint(ray_session, tmp_path, digits_checkpoints, clean):
    """A first run on a wrong checkpoint file fails before committing a row of it; the fixed
    file at the same path is accepted (before: refused on that store forever)."""
    ckpt = tmp_path / "model0.pt"
    torch.save(digits.make_model(hidden=16).state_dict(), ckpt)  # another architecture
    store = tmp_path / "s.zarr"
    cfg = job(store, [ckpt, digits_checkpoints[1]])
    with pytest.raises(Exception, match="size mismatch"):
        run_job(cfg)
    shutil.copy(digits_checkpoints[0], ckpt)
    run_job(cfg)
    assert_clean(stored_scores(store), clean[1])


def nan_train(row: int):
    """The digits train set with a NaN pixel in one row (pickled by value for workers)."""

    def train_set():
        ds = digits.train_set()
        x, y = ds.tensors
        x = x.clone()
        x[row, 5] = float("nan")
        return torch.utils.data.TensorDataset(x, y)

    return train_set


@pytest.mark.ray
def test_a_run_stopped_by_a_nan_row_reruns_with_the_row_fixed(
    ray_session, tmp_path, digits_checkpoints, clean
):
    """The train set is bound by what was committed, as checkpoints are (before: the fixed
    data was refused, "dataset_fingerprint: store has …, requested …", and forced a new store).
    Changed data once rows are committed is still refused, naming the row."""
    store = tmp_path / "s.zarr"
    bad = job(store, digits_checkpoints, data=DataConfig(train=nan_train(7)))
    with pytest.raises(Exception, match=r"non-finite projected gradients .* rows \[7\]") as e:
        run_job(bad)
    assert isinstance(e.value, NonFiniteError) or "NonFiniteError" in str(e.value)
    stopped = FeatureStore.open(store, mode="r")
    assert not stopped.train_rows(0).done_chunks()[0]  # row 7's chunk: never committed
    run_job(job(store, digits_checkpoints))  # the same store, row 7 fixed
    assert_clean(stored_scores(store), clean[1])
    assert FeatureStore.open(store).spec.dataset_fingerprint == clean_fingerprint(clean[0])
    with pytest.raises(StoreMismatchError, match=r"row 777 differs"):
        run_job(job(store, digits_checkpoints, data=DataConfig(train=changed_train(777))))


def clean_fingerprint(store: Path) -> str:
    return FeatureStore.open(store, mode="r").spec.dataset_fingerprint


@pytest.mark.ray
def test_committed_rows_of_another_checkpoint_refuse_a_new_one(copy, tmp_path, digits_checkpoints):
    other = tmp_path / "other.pt"
    torch.save(digits.make_model().state_dict(), other)  # same shapes, other weights
    with pytest.raises(
        StoreMismatchError, match=r"model_id=1 \(\S*other\.pt\) in .* different checkpoint"
    ):
        run_job(job(copy, [digits_checkpoints[0], other]))


# ---- scoring that fails after a complete one -----------------------------------------------


@pytest.mark.slow
@pytest.mark.ray
def test_topk_above_train_block(copy, clean, digits_checkpoints):
    """scoring.train_block < topk (before: a traceback, and the complete scores deleted)."""
    cfg = job(copy, digits_checkpoints, scoring=ScoringConfig(topk=20, train_block=8))
    run_job(cfg)
    sset = FeatureStore.open(copy, mode="r").score_set("targets", VARIANT)
    assert sset is not None
    s = sset.scores()
    assert_clean(s, clean[1])
    top = sset.read_topk()
    vals = np.take_along_axis(s, top["proponents_idx"].T, 0).T
    np.testing.assert_array_equal(vals, -np.sort(-s, axis=0)[:20].T)
    np.testing.assert_array_equal(top["proponents_val"], vals)


# ---- full disk -----------------------------------------------------------------------------


class SmallDisk:
    """A 48 MiB tmpfs; ``fill`` takes all but ``leave`` bytes of it, ``free`` gives them back."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.filler = root / "filler"

    def fill(self, leave: int) -> None:
        fd = os.open(self.filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        try:
            for block in (b"\0" * (1 << 20), b"\0" * 4096):
                try:
                    while os.write(fd, block):
                        pass
                except OSError as e:
                    assert e.errno == errno.ENOSPC
            os.ftruncate(fd, max(0, os.fstat(fd).st_size - leave))
        finally:
            os.close(fd)

    def free(self) -> None:
        self.filler.unlink()


@pytest.fixture
def small_disk(tmp_path):
    root = tmp_path / "disk"
    root.mkdir()
    out = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=48m", "tmpfs", str(root)],
        capture_output=True,
        text=True,
    )
    if out.returncode:
        pytest.skip(f"cannot mount a tmpfs here ({out.stderr.strip()}): full-disk cases need root")
    try:
        yield SmallDisk(root)
    finally:
        subprocess.run(["umount", "-l", str(root)], check=False)


def test_full_disk_during_the_reduce(small_disk, digits_checkpoints):
    """TRAKer: the disk fills as XᵀX is written, with room for its metadata but not its data
    (the issue's case: before, a rerun read zeros and gave rc 0 and scores 3·10³ × max|S| off)."""
    user = UserLoop(small_disk.root / "s.zarr", digits_checkpoints)
    t = user.traker()
    user.features(t)
    for i in range(len(user.states)):
        # finalize's fold would remove the staged rows of the 500-row batches, freeing space
        # XᵀX could then use: remove them first, so the disk is full when XᵀX is written
        t.store.train_rows(i).staged.fold()
        assert "staged" not in t.store.train_rows(i).group
    small_disk.fill(leave=4096)  # a zarr.json fits, an 8 KiB XᵀX does not
    with pytest.raises(OSError, match="No space left"):
        t.finalize_features()
    small_disk.free()
    after = user.run()
    assert user.featurised == {"train": 0, "target": 2 * M}

    shutil.rmtree(user.save_dir)
    assert_clean(after, user.run())


@pytest.mark.slow
@pytest.mark.ray
def test_full_disk_while_featurising(small_disk, digits_checkpoints, clean):
    """The disk fills after the first shard: the run fails; once space is freed the rerun
    resumes and gives the clean scores."""
    store = small_disk.root / "s.zarr"
    shards = []

    def fill_once(result):
        shards.append(result)
        if len(shards) == 1:
            small_disk.fill(leave=0)

    with pytest.raises(Exception, match="No space left"):
        run_job(job(store, digits_checkpoints), on_shard=fill_once)
    small_disk.free()
    result = run_job(job(store, digits_checkpoints))
    assert result.rows_reused["train"] >= SHARD
    assert_clean(stored_scores(store), clean[1])


@pytest.mark.parametrize("leave", [0, 4096])
def test_full_disk_while_a_score_set_is_laid_out_leaves_nothing(small_disk, leave):
    """The disk fills while a new score set's metadata is written (0: its group's zarr.json,
    4096: one of its arrays'): the partial folder goes, the published set stays (CI once left a
    ``.partial-`` folder behind when the disk filled before the scoring's ``with`` was entered)."""
    store = FeatureStore.create_or_open(small_disk.root / "s.zarr", synthetic_spec(8, 32))
    scores = np.arange(8 * 3, dtype=np.float32).reshape(8, 3)
    with store.create_scores("targets", "v", 8, 3, 2, {}) as first:
        first.write_block(0, 0, scores)
        first.publish()
    small_disk.fill(leave=leave)
    with pytest.raises(OSError, match="No space left"):
        store.create_scores("targets", "v", 8, 3, 2, {})
    # zarr's own temporary files (``zarr.<uuid>.partial``, of parent metadata it rewrites
    # from threads that may outlive the exception) remove themselves: not ours to check
    targets = small_disk.root / "s.zarr" / "scores" / "targets"
    names = sorted(p.name for p in targets.iterdir() if not p.name.startswith("zarr."))
    assert names == ["v"]
    small_disk.free()
    np.testing.assert_array_equal(store.score_set("targets", "v").scores(), scores)


@pytest.mark.slow
@pytest.mark.ray
def test_full_disk_while_rescoring_keeps_the_previous_scores(small_disk, clean, digits_checkpoints):
    """A rescoring (here with another topk) that runs out of disk midway: the complete scores
    of the variant are still there and read back (before: deleted first)."""
    store = small_disk.root / "s.zarr"
    shutil.copytree(clean[0], store)
    cfg = job(store, digits_checkpoints, scoring=ScoringConfig(topk=25))
    small_disk.fill(leave=8 * 4096)  # the new set's metadata fits, its scores do not
    with pytest.raises(Exception, match="No space left"):
        run_job(cfg)
    assert not [p for p in (store / "scores" / "targets").iterdir() if ".partial-" in p.name]
    assert_clean(stored_scores(store), clean[1])
    assert FeatureStore.open(store, mode="r").score_set("targets", VARIANT).topk == 10
    small_disk.free()
    run_job(cfg)
    assert_clean(stored_scores(store), clean[1])
    assert FeatureStore.open(store, mode="r").score_set("targets", VARIANT).topk == 25
