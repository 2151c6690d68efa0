"""Store paths as URLs without a server: ``file://`` is a local directory, options are
checked, credentials are kept out of messages, and a URL's scheme needs its library."""

from __future__ import annotations

import numpy as np
import pytest

from tests.fixtures.synthetic import synthetic_spec
from trak_dist._remote_report import run_name
from trak_dist.errors import ConfigError
from trak_dist.store import FeatureStore, is_url, redact, store_lock
from trak_dist.store._remote import beside
from trak_dist.store._verify import verify


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


def test_credentials_never_reach_a_message(monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s3cr3t-value-123")
    monkeypatch.setenv("AWS_SESSION_TOKEN", "tok-abcdef-987")
    text = "failed with s3cr3t-value-123 and tok-abcdef-987 at http://user:pw@host:9000/b"
    assert redact(text) == "failed with *** and *** at http://***@host:9000/b"


def test_leases_and_reports_go_beside_a_named_store():
    assert beside("s3://b/p/run.zarr", "lock") == ("s3://b/p", "run.zarr.lock")
    assert beside("s3://b/run.zarr/", "reports/x/r.md") == ("s3://b", "run.zarr.reports/x/r.md")
    with pytest.raises(ConfigError, match="is a bucket's root"):
        beside("s3://bucket", "lock")


def test_report_folders_are_named_after_hydra_s_run():
    assert run_name("outputs/2026-11-28/02-40-00") == "2026-11-28_02-40-00"
    assert run_name("multirun/2026-11-28/02-40-00/3") == "2026-11-28_02-40-00_3"
    assert run_name("/tmp/my run").endswith("_my_run")
