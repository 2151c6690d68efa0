"""The store on a real S3 server: rows, checksums, verify/repair, and no file beside it."""

from __future__ import annotations

import numpy as np
import obstore
import pytest
from obstore.store import from_url

from tests.fixtures.s3 import BUCKET, SECRET_KEY
from tests.fixtures.synthetic import synthetic_spec
from trak_dist.errors import ConfigError, StoreDamagedError, StoreStateError
from trak_dist.store import FeatureStore
from trak_dist.store.verify import repair, verify

pytestmark = pytest.mark.s3
N, P, CHUNK = 100, 8, 32


def client(url: str):
    return from_url(url, client_options={"allow_http": True})


def keys(url: str) -> list[str]:
    return sorted(o["path"] for batch in obstore.list(client(url)) for o in batch)


def filled(url: str, ids=(0,)) -> FeatureStore:
    store = FeatureStore.create_or_open(
        url, synthetic_spec(N, P, dtype="float32", chunk_rows=CHUNK)
    )
    rng = np.random.default_rng(0)
    for c in ids:
        rows = store.ensure_checkpoint(c, f"ckpt{c}")
        store.bind(rows, f"ckpt{c}", f"model_id={c}")
        rows.write(0, rng.standard_normal((N, P)), rng.uniform(size=N), np.arange(1, N + 1))
        rows.commit(0, N)
        store.write_xtx(c, np.eye(P))
    return store


def test_rows_round_trip_and_nothing_is_written_on_local_disk(
    s3_url, s3_server, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    store = filled(s3_url)
    again = FeatureStore.open(s3_url, mode="r")
    x = again.train_rows(0).read(0, N)
    np.testing.assert_array_equal(
        x, np.random.default_rng(0).standard_normal((N, P)).astype(np.float32)
    )
    assert again.read_xtx(0) is not None and store.where == s3_url
    assert list(tmp_path.iterdir()) == []
    # the lease beside the store was given back; the store is the bucket's, unreadable unsigned
    parent = s3_url.rsplit("/", 1)[0]
    assert "store.zarr.lock" in keys(parent)
    assert s3_server.anonymous_status(s3_url.split(f"{BUCKET}/", 1)[1] + "/zarr.json") == 403


def test_a_damaged_chunk_is_found_repaired_and_featurised_again(s3_url):
    filled(s3_url)
    chunk = "train/0/X/c/1/0"
    raw = bytearray(bytes(obstore.get(client(s3_url), chunk).bytes()))
    raw[5] ^= 1
    obstore.put(client(s3_url), chunk, bytes(raw))
    with pytest.raises(StoreDamagedError, match=r"train/0/X chunk 1 \(rows \[32, 64\)\) fails"):
        FeatureStore.open(s3_url).train_rows(0).read(0, N)
    report = verify(s3_url)
    assert [p.node for p in report.problems] == ["train/0/X"]
    assert "train/0/xtx" in report.problems[0].drop
    _, actions = repair(s3_url)
    assert any("un-committed 1 chunk(s) of train/0" in a for a in actions)
    assert chunk not in keys(s3_url) and "train/0/xtx/zarr.json" not in keys(s3_url)
    rows = FeatureStore.open(s3_url).train_rows(0)
    assert rows.flags.committed().tolist() == [True, False, True, True]
    assert not verify(s3_url).problems


def test_torn_metadata_on_s3_is_named_and_dropped_by_repair(s3_url):
    filled(s3_url)
    obstore.put(client(s3_url), "train/0/Q/zarr.json", b'{"zarr_format": 3, "node_')
    with pytest.raises(StoreStateError, match=r"train/0/Q/zarr.json .*trak-dist store repair"):
        FeatureStore.open(s3_url)
    _, actions = repair(s3_url)
    assert "dropped train/0" in actions
    assert FeatureStore.open(s3_url).checkpoint_ids() == []


def test_overwrite_empties_the_prefix(s3_url):
    filled(s3_url, ids=(0, 1))
    spec = synthetic_spec(N, P, dtype="float32", chunk_rows=CHUNK)
    store = FeatureStore.create_or_open(s3_url, spec, overwrite=True)
    assert store.checkpoint_ids() == []
    assert not [k for k in keys(s3_url) if k.startswith("train/0")]


def test_wrong_credentials_and_a_missing_bucket_are_one_line_each(s3_url, monkeypatch):
    spec = synthetic_spec(N, P, dtype="float32", chunk_rows=CHUNK)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret-3f9e")
    with pytest.raises(StoreStateError) as e:
        FeatureStore.create_or_open(s3_url, spec)
    assert "access denied (SignatureDoesNotMatch)" in str(e.value) and s3_url in str(e.value)
    assert "not-the-secret-3f9e" not in str(e.value) and "\n" not in str(e.value)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    assert keys(s3_url) == []  # nothing written
    other = "s3://no-such-bucket-trak/run.zarr"
    with pytest.raises(StoreStateError, match="the bucket 'no-such-bucket-trak' does not exist"):
        FeatureStore.create_or_open(other, spec)
    assert keys(s3_url.rsplit("/", 1)[0]) == []


def test_store_options_are_checked(s3_url):
    spec = synthetic_spec(N, P, dtype="float32", chunk_rows=CHUNK)
    with pytest.raises(ConfigError, match="no_such_option"):
        FeatureStore.create_or_open(s3_url, spec, options={"no_such_option": "1"})
    from trak_dist.config import StoreConfig

    with pytest.raises(ConfigError, match=r"look like credentials.*AWS_SECRET_ACCESS_KEY"):
        StoreConfig(path=s3_url, options={"secret_access_key": SECRET_KEY})
    with pytest.raises(ConfigError, match="is a local directory"):
        StoreConfig(path="local.zarr", options={"endpoint": "http://x"})
    with pytest.raises(ConfigError, match="lease_ttl='soon'"):
        StoreConfig(path=s3_url, options={"lease_ttl": "soon"})
    with pytest.raises(ConfigError, match="ftp:// is not an object store"):
        FeatureStore.open("ftp://host/run.zarr")
