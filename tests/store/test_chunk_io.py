"""The store's own chunk writes and reads (``store/_chunk_io.py``) against Zarr's: the same bytes
on disk, the same values read, the same errors for damaged chunks; and ``chunk_rows: auto``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import zarr

from tests.fixtures.synthetic import synthetic_spec
from trak_dist.errors import NonFiniteError, StoreDamagedError
from trak_dist.store import FeatureStore, resolve_chunk_rows
from trak_dist.store._chunk_io import as_stored, encode_rows, is_plain, read_region, store_chunks
from trak_dist.store._layout import MIN_CHUNK_ROWS, auto_chunk_rows
from trak_dist.store._zarr import compressors


def _files(root: Path) -> dict[str, bytes]:
    return {
        str(f.relative_to(root)): f.read_bytes()
        for f in sorted(root.rglob("*"))
        if f.is_file() and f.name != "zarr.json"
    }


@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("shape,chunks", [((1000, 96), (256, 96)), ((700, 100), (128, 48))])
def test_chunks_written_here_are_byte_for_byte_zarr_s(tmp_path, dtype, shape, chunks):
    """Whole row chunks, a short last one and column chunks with a short edge, float32 rows
    cast to float16 or kept: every chunk file equals the one Zarr writes for the same values."""
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(shape) * 10.0 ** rng.integers(-9, 4, shape)).astype(np.float32)
    arrays = {}
    for name in ("ours", "zarr"):
        g = zarr.open_group(tmp_path / name, mode="w")
        arrays[name] = g.create_array(
            "X", shape=shape, chunks=chunks, dtype=dtype,
            compressors=compressors("none"), fill_value=np.nan,
        )  # fmt: skip
    assert is_plain(arrays["ours"])
    for s in range(0, shape[0], chunks[0] * 2):
        e = min(shape[0], s + chunks[0] * 2)
        store_chunks(arrays["ours"], encode_rows(arrays["ours"], slice(s, e), x[s:e]))
        arrays["zarr"][s:e] = x[s:e].astype(dtype)
    ours, theirs = _files(tmp_path / "ours"), _files(tmp_path / "zarr")
    assert ours.keys() == theirs.keys() and len(ours) >= 4
    assert all(ours[k] == theirs[k] for k in ours)
    np.testing.assert_array_equal(np.asarray(arrays["ours"][:]), x.astype(dtype))


def test_the_cast_rounds_as_numpy_s_on_every_float32_bit_pattern_sampled():
    """torch's float32 → float16 cast (used for speed) against numpy's astype, over random bit
    patterns (denormals, ties, overflow to inf; NaN payloads aside: NaN is never stored)."""
    rng = np.random.default_rng(1)
    bits = rng.integers(0, 2**32, 2_000_000, dtype=np.uint64).astype(np.uint32)
    x = bits.view(np.float32).reshape(-1, 1000)
    g = zarr.open_group(zarr.storage.MemoryStore(), mode="w")
    arr = g.create_array("X", shape=x.shape, chunks=(500, 1000), dtype="float16", fill_value=0)
    with np.errstate(over="ignore"):
        want = x.astype(np.float16)
    keep = ~np.isnan(want)
    encoded = np.concatenate([c.data for c in encode_rows(arr, slice(0, x.shape[0]), x)])
    for data in (encoded, as_stored(x, np.dtype(np.float16))):  # the store's and the worker's
        np.testing.assert_array_equal(data[keep].view(np.uint16), want[keep].view(np.uint16))
        np.testing.assert_array_equal(np.isnan(data), np.isnan(want))


def test_reads_from_the_files_equal_zarr_s_for_any_region(tmp_path):
    rng = np.random.default_rng(2)
    g = zarr.open_group(tmp_path / "s", mode="w")
    arr = g.create_array(
        "X", shape=(1000, 100), chunks=(128, 48), dtype="float16",
        compressors=compressors("none"), fill_value=np.nan,
    )  # fmt: skip
    arr[:896] = rng.standard_normal((896, 100)).astype(np.float16)  # rows 896… never written
    for region in [((0, 1000), (0, 100)), ((128, 512), (0, 100)), ((5, 700), (3, 97)),
                   ((0, 256), (0, 48)), ((900, 1000), (0, 100)), ((10, 10), (0, 100))]:  # fmt: skip
        got = read_region(arr, region)
        assert got is not None
        want = np.asarray(arr[tuple(slice(a, b) for a, b in region)])
        np.testing.assert_array_equal(got, want)


def test_a_damaged_chunk_file_raises_as_zarr_s_decoder_does(tmp_path):
    g = zarr.open_group(tmp_path / "s", mode="w")
    arr = g.create_array(
        "X", shape=(512, 64), chunks=(256, 64), dtype="float16",
        compressors=compressors("none"), fill_value=np.nan,
    )  # fmt: skip
    arr[:] = np.ones((512, 64), np.float16)
    chunk = tmp_path / "s" / "X" / "c" / "1" / "0"
    raw = bytearray(chunk.read_bytes())
    raw[100] ^= 1
    chunk.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match="checksum"):
        read_region(arr, ((0, 512), (0, 64)))
    chunk.write_bytes(bytes(raw[:-10]))
    with pytest.raises(ValueError, match="truncated"):
        read_region(arr, ((256, 512), (0, 64)))


def test_row_sets_write_and_read_through_it_and_name_damage(tmp_path):
    """The RowSet path end to end: rows written, read back, a flipped bit named as a damaged
    chunk (StoreDamagedError, as through Zarr), a non-finite row refused before any write."""
    n, p = 600, 64
    store = FeatureStore.create_or_open(tmp_path / "s.zarr", synthetic_spec(n, p))
    rows = store.ensure_checkpoint(0)
    x = np.random.default_rng(3).standard_normal((n, p)).astype(np.float32)
    bad = x[256:512].copy()
    bad[7, 3] = np.inf
    with pytest.raises(NonFiniteError, match="rows \\[263\\]"):
        rows.write(256, bad, np.ones(256, np.float32), np.arange(1, 257, dtype=np.uint64))
    assert not (tmp_path / "s.zarr" / "train" / "0" / "X" / "c" / "1").exists()
    for s in range(0, n, 256):
        e = min(n, s + 256)
        rows.write(s, x[s:e], np.ones(e - s, np.float32), np.arange(s + 1, e + 1, dtype=np.uint64))
        rows.commit(s, e)
    assert rows.is_complete()
    np.testing.assert_array_equal(rows.read(0, n), x.astype(np.float16))
    chunk = tmp_path / "s.zarr" / "train" / "0" / "X" / "c" / "1" / "0"
    raw = bytearray(chunk.read_bytes())
    raw[8] ^= 4
    chunk.write_bytes(bytes(raw))
    with pytest.raises(
        StoreDamagedError, match="chunk 1 \\(rows \\[256, 512\\)\\) fails its checksum"
    ):
        rows.read(0, n)


def test_auto_chunk_rows_aims_at_megabytes_and_keeps_shards_spread():
    assert auto_chunk_rows(10_000_000, 512 * 2) == 16384  # 16 MiB of float16 rows at p = 512
    assert auto_chunk_rows(10_000_000, 4096 * 2) == 2048
    assert auto_chunk_rows(10_000_000, 2048 * 2 * 5) == 1024  # X and four label draws
    assert auto_chunk_rows(100_000, 512 * 2) == 8192  # an eighth of n at most
    assert auto_chunk_rows(1500, 512 * 2) == MIN_CHUNK_ROWS  # the digits default: as before
    assert auto_chunk_rows(10_000_000, 11_700_000 * 2) == MIN_CHUNK_ROWS  # wide rows
    assert resolve_chunk_rows(512, 10**7, 1024) == 512  # a number is kept
    assert resolve_chunk_rows("auto", 10**7, 1024, shard_rows=3072) == 1024  # divides the shard


def test_auto_keeps_the_chunk_rows_of_a_store_written_before(tmp_path):
    where = tmp_path / "old.zarr"
    FeatureStore.create_or_open(where, synthetic_spec(10**6, 512, chunk_rows=256))
    stored = FeatureStore.stored_spec(where)
    assert stored is not None
    assert resolve_chunk_rows("auto", 10**6, 1024, stored=stored) == 256
    assert FeatureStore.stored_spec(tmp_path / "none.zarr") is None
