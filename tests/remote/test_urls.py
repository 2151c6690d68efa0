"""URLs without a server: which paths are URLs, credentials kept out of messages, the objects
beside a store, and the names of the run reports written there."""

from __future__ import annotations

import pytest

from trak_dist._remote_report import run_name
from trak_dist.errors import ConfigError
from trak_dist.remote import beside, is_url, local_path, redact


def test_which_paths_are_urls():
    assert is_url("s3://b/s.zarr") and is_url("gs://b/s.zarr") and is_url("az://c/s.zarr")
    assert not is_url("file:///tmp/s.zarr") and not is_url("/tmp/s.zarr")
    assert local_path("file:///tmp/s.zarr") == "/tmp/s.zarr" == local_path("/tmp/s.zarr")


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
