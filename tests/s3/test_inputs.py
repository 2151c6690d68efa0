"""Checkpoints and data on S3: fetched once per node into the cache, checked against the
store's fingerprints, and the same bits as the local files."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.fixtures import llm_models
from tests.fixtures.pipeline import run_in_process, small_job, stored_features
from tests.s3.conftest import upload
from trak_dist._compose import compose_job
from trak_dist.errors import ConfigError, StoreMismatchError
from trak_dist.pipeline import resolve_inputs
from trak_dist.remote import _fetch, local_copy

pytestmark = pytest.mark.s3


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAK_DIST_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(_fetch, "_fetched", {})
    return tmp_path / "cache" / "inputs"


def test_a_file_and_a_folder_are_fetched_once_and_again_when_changed(
    s3_url, tmp_path, cache, caplog
):
    (tmp_path / "d" / "sub").mkdir(parents=True)
    (tmp_path / "d" / "a.txt").write_text("a")
    (tmp_path / "d" / "sub" / "b.txt").write_text("b")
    (tmp_path / "f.bin").write_bytes(b"\x00\x01")
    base = s3_url.rsplit("/", 1)[0]
    folder, file = upload(tmp_path / "d", f"{base}/d"), upload(tmp_path / "f.bin", f"{base}/f.bin")
    with caplog.at_level(logging.INFO, logger="trak_dist"):
        got = local_copy(folder + "/")
        assert local_copy(file).read_bytes() == b"\x00\x01"
    assert (got / "a.txt").read_text() == "a" and (got / "sub" / "b.txt").read_text() == "b"
    assert caplog.text.count("fetched s3://") == 2
    _fetch._fetched.clear()  # a new process on the node: a listing, no download
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="trak_dist"):
        assert local_copy(folder) == got
    assert "fetched" not in caplog.text
    (tmp_path / "d" / "a.txt").write_text("A")
    upload(tmp_path / "d", folder)
    _fetch._fetched.clear()
    again = local_copy(folder)
    assert again != got and (again / "a.txt").read_text() == "A"
    assert not [p for p in cache.rglob(".partial-*")]
    with pytest.raises(ConfigError, match="no object and no prefix with objects there"):
        local_copy(f"{base}/nothing-here")


def test_a_job_with_checkpoints_and_store_on_s3_gives_the_local_bits(
    s3_url, tmp_path, digits_checkpoints, local_reference, cache, monkeypatch
):
    base = s3_url.rsplit("/", 1)[0]
    urls = [upload(Path(c), f"{base}/ckpt/{Path(c).name}") for c in digits_checkpoints]
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    remote = small_job(s3_url, urls)  # type: ignore[arg-type]
    assert remote.model.checkpoints == urls
    result = run_in_process(remote)
    assert result.store == s3_url
    for a, b in zip(stored_features(remote), local_reference, strict=True):
        np.testing.assert_array_equal(a, b)
    assert list(work.iterdir()) == []  # no lock, lease or report beside the store
    assert sum(run_in_process(remote).rows_computed.values()) == 0
    # checkpoint 0 replaced on S3: its node copy no longer matches what the rows are bound to
    upload(Path(digits_checkpoints[1]), urls[0])
    _fetch._fetched.clear()
    with pytest.raises(StoreMismatchError, match="model_id=0"):
        run_in_process(remote)


@pytest.mark.slow
def test_a_causal_lm_job_with_checkpoints_and_data_on_s3(s3_url, tmp_path, cache):
    root = tmp_path / "llm"
    root.mkdir()
    ckpts = llm_models.checkpoints(root, "gpt2", num=2)
    base = s3_url.rsplit("/", 1)[0]
    for c in ckpts:
        upload(c, f"{base}/llm/{c.name}")
    for f in ("train.jsonl", "targets.jsonl"):
        upload(root / f, f"{base}/llm/{f}")
    common = ["model=hf", "data=text", "task=causal_lm", "proj_dim=16", "progress=false"]

    def job(where: str, store: str, ckpt: list[str]):
        return compose_job([
            *common, f"store.path={store}", f"model.checkpoints=[{','.join(ckpt)}]",
            f"data.train={where}/train.jsonl", f"data.targets={where}/targets.jsonl",
        ])  # fmt: skip

    local = job(str(root), str(tmp_path / "local.zarr"), [str(c) for c in ckpts])
    remote = job(f"{base}/llm", s3_url, [f"{base}/llm/{c.name}" for c in ckpts])
    # resolved on the driver, the data stays a URL (each process fetches it into its cache)
    assert resolve_inputs(remote).data.train.path == f"{base}/llm/train.jsonl"
    run_in_process(local)
    shutil.rmtree(root)  # the remote job reads nothing local
    run_in_process(remote)
    from trak_dist.store import FeatureStore

    def scores(cfg):
        store = FeatureStore.open(cfg.store.path, mode="r")
        (variant,) = store.score_variants("targets")
        sset = store.score_set("targets", variant)
        assert sset is not None
        return sset.scores()

    np.testing.assert_array_equal(scores(remote), scores(local))
