"""Whole chunks of the store's uncompressed arrays, encoded and written as Zarr itself would.

Why by hand: Zarr 3.1's write of a chunk compares it with the fill value, copies it once into
the chunk, once more to append the crc32c, and then writes it, each step in its own pass over
memory; with numpy's float32 → float16 cast (a scalar loop) before it, a row set was written
at a tenth of a plain file's speed on the same RAM disk (docs/store.md, "Speed";
``python -m benchmarks.store_io``). Here the rows are cast straight into each chunk's own
buffer (torch's vectorised cast: the same bits as numpy's, ``tests/store/test_chunk_io.py``),
checked finite in that buffer, its crc32c written behind them, and each buffer written as one
file (on S3, all of a write's chunks in one concurrent call). The bytes are exactly those of
Zarr's chain ``bytes`` (little endian) → ``crc32c``, so Zarr reads them, and verify and repair
check them, as before. An array with any
other chain (a compressor: ``store.codec``) is written through Zarr.

Reads of such arrays in a local store (``read_region``) go straight from the chunk files into
the output, checksum checked; elsewhere Zarr reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import math
import os
import threading
import uuid
from collections import OrderedDict
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import google_crc32c
import numpy as np
import torch
import zarr
from zarr.codecs import BytesCodec, Crc32cCodec
from zarr.core.buffer import default_buffer_prototype
from zarr.core.sync import sync
from zarr.storage import LocalStore

# torch casts between these dtypes with vectorised code; numpy's float16 cast is a scalar loop
_TORCH = {np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)}


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """torch's CPU ops of this thread on one thread inside (torch's thread count is per thread):
    a cast or a min/max pass is bound by memory, which one thread already moves at its pace, and
    a second thread that waits for a busy core stalls both (measured on a shared 2-core machine:
    the cast at 0.3 GB/s on two threads, 3 GB/s on one)."""
    before = torch.get_num_threads()
    if before == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def is_plain(arr: zarr.Array[Any]) -> bool:
    """Whether ``arr``'s chunks are their values' little-endian bytes and a crc32c, nothing
    else (the store's default for X, G, Q and H)."""
    meta = arr.metadata
    codecs = getattr(meta, "codecs", None)
    if codecs is None or len(codecs) != 2:
        return False
    raw, crc = codecs
    little = getattr(raw, "endian", None)
    return (
        isinstance(raw, BytesCodec)
        and isinstance(crc, Crc32cCodec)
        and (little is None or getattr(little, "value", little) == "little")
        and arr.dtype.byteorder in ("=", "<", "|")
    )


@dataclass
class EncodedChunk:
    """One chunk ready to store: ``data`` its values (a view of ``buf``), ``buf`` the bytes
    Zarr would store (the values, then 4 bytes of crc32c once ``seal`` ran)."""

    key: str
    buf: np.ndarray
    data: np.ndarray

    def seal(self) -> None:
        crc = google_crc32c.value(self.buf[:-4])
        self.buf[-4:] = np.frombuffer(np.uint32(crc).tobytes(), dtype=np.uint8)


def _cast_into(out: np.ndarray, values: np.ndarray) -> None:
    """``out[...] = values`` cast to ``out``'s dtype, rounding as numpy's ``astype`` does."""
    if values.dtype == out.dtype:
        np.copyto(out, values)
    elif values.dtype in _TORCH and out.dtype in _TORCH:
        torch.from_numpy(out).copy_(torch.from_numpy(np.ascontiguousarray(values)))
    else:
        with np.errstate(over="ignore"):  # as astype: an overflow is refused by the caller
            np.copyto(out, values, casting="unsafe")


def as_stored(values: np.ndarray, dtype: np.dtype[Any]) -> np.ndarray:
    """``values.astype(dtype)``, bit for bit, cast by torch on one thread (numpy's float32 →
    float16 is a scalar loop, ~10× slower)."""
    out = np.empty(values.shape, dtype)
    with one_thread():
        _cast_into(out, values)
    return out


def encode_rows(arr: zarr.Array[Any], rows: slice, values: np.ndarray) -> list[EncodedChunk]:
    """The chunks of ``arr`` covering ``rows`` (whole row chunks, or up to the last row) holding
    ``values`` (``[rows, *arr.shape[1:]]``, any castable dtype), unsealed; the part of an edge
    chunk beyond the array holds the fill value, as Zarr writes it."""
    start, stop = rows.start or 0, arr.shape[0] if rows.stop is None else rows.stop
    chunks, shape = arr.chunks, arr.shape
    itemsize = arr.dtype.itemsize
    fill = arr.metadata.fill_value
    col_spans = [
        [(c, min(c + size, dim)) for c in range(0, dim, size)]
        for dim, size in zip(shape[1:], chunks[1:], strict=True)
    ]
    out = []
    for r0 in range(start, stop, chunks[0]):
        r1 = min(r0 + chunks[0], shape[0])
        for spans in itertools.product(*col_spans):
            buf = np.empty(math.prod(chunks) * itemsize + 4, dtype=np.uint8)
            data = buf[:-4].view(arr.dtype).reshape(chunks)
            region = (slice(0, r1 - r0), *(slice(0, b - a) for a, b in spans))
            if any(s.stop < size for s, size in zip(region, chunks, strict=True)):
                data[...] = fill
            source = (slice(r0 - start, r1 - start), *(slice(a, b) for a, b in spans))
            _cast_into(data[region], values[source])
            cols = zip(spans, chunks[1:], strict=True)
            coords = (r0 // chunks[0], *(a // size for (a, _), size in cols))
            key = f"{arr.path}/{arr.metadata.encode_chunk_key(coords)}"
            out.append(EncodedChunk(key, buf, data[region]))
    return out


def store_chunks(arr: zarr.Array[Any], encoded: list[EncodedChunk]) -> None:
    """Seal and write ``encoded`` (``encode_rows`` of ``arr`` or of any array in its store):
    each chunk is one key, written whole. On a local store each file is written as Zarr's
    ``LocalStore`` writes it (a temporary file beside it, renamed over it) in this thread: Zarr's
    hop to its event loop and a worker thread per chunk cost more than a small chunk's write;
    elsewhere (S3, GCS) the chunks go to the store concurrently, in one call."""
    for chunk in encoded:
        chunk.seal()
    if not encoded:
        return
    store = arr.store_path.store
    root = _local_root(store)
    if root is not None:
        if store.read_only:
            raise ValueError(f"the store at {root} was opened read-only; cannot write chunks.")
        for chunk in encoded:
            _write_file(root / chunk.key, chunk.buf)
        return
    prototype = default_buffer_prototype()

    async def put_all() -> None:
        await asyncio.gather(
            *(store.set(c.key, prototype.buffer.from_array_like(c.buf)) for c in encoded)
        )

    sync(put_all())


def _local_root(store: Any) -> Path | None:
    """The directory of a plain ``LocalStore`` (not a subclass: one that counts or wraps its
    calls keeps them)."""
    return Path(store.root) if type(store) is LocalStore else None


def _write_file(path: Path, data: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{uuid.uuid4().hex}.partial")  # Zarr's name for it
    try:
        with open(tmp, "wb") as f:
            f.write(data.data)
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def read_region(arr: zarr.Array[Any], region: tuple[tuple[int, int], ...]) -> np.ndarray | None:
    """``arr`` over ``region`` (``[start, end)`` per dimension) read straight from the chunk
    files of a plain array in a local store, or None for any other array (the caller asks Zarr).
    A missing chunk reads as the fill value, as in Zarr; a chunk whose crc32c or size is wrong
    raises ValueError ("checksum"), as Zarr's decoder does.

    Why by hand: Zarr reads every chunk on a worker thread behind its event loop and copies it
    out of its decoded buffer; here a whole chunk of full rows is read straight into the output
    (``readinto``), its checksum taken there, so a block of rows costs one pass over its
    bytes."""
    root = _local_root(arr.store_path.store)
    if root is None or not is_plain(arr):
        return None
    chunks, shape = arr.chunks, arr.shape
    out = np.empty(tuple(b - a for a, b in region), dtype=arr.dtype)
    spans = [range(a // c, -(-b // c)) for (a, b), c in zip(region, chunks, strict=True)]
    jobs = []
    for coords in itertools.product(*spans):
        lo = [c * size for c, size in zip(coords, chunks, strict=True)]
        hi = [min(a + size, dim) for a, size, dim in zip(lo, chunks, shape, strict=True)]
        got = tuple(
            slice(max(a, ra) - ra, min(b, rb) - ra)
            for a, b, (ra, rb) in zip(lo, hi, region, strict=True)
        )
        inner = tuple(
            slice(max(a, ra) - a, min(b, rb) - a)
            for a, b, (ra, rb) in zip(lo, hi, region, strict=True)
        )
        # every row and column of the chunk wanted (an edge chunk's never are: it is padded)
        whole = all(s.stop - s.start == size for s, size in zip(inner, chunks, strict=True))
        path = root / f"{arr.path}/{arr.metadata.encode_chunk_key(coords)}"
        jobs.append((path, out[got], inner, whole))

    def one(job: tuple[Path, np.ndarray, tuple[slice, ...], bool]) -> None:
        _read_chunk(arr, *job)

    if len(jobs) > 1:  # a read and its checksum wait on memory, not on this thread's core
        list(_readers().map(one, jobs))
    else:
        for job in jobs:
            one(job)
    return out


@functools.cache
def _readers() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(2, thread_name_prefix="trak-dist-chunk-reader")


def _read_chunk(
    arr: zarr.Array[Any], path: Path, target: np.ndarray, inner: tuple[slice, ...], whole: bool
) -> None:
    """One chunk's part ``inner`` into ``target``: a whole chunk straight from its file; a part
    of one through ``_CACHE`` (the scorer reads blocks of rows smaller than a chunk in order:
    each chunk is read and checked once, not once per block)."""
    try:
        if whole and target.flags.c_contiguous:  # read into the output itself
            with open(path, "rb", buffering=0) as f:
                data = target.reshape(-1).view(np.uint8)
                crc = np.empty(4, dtype=np.uint8)
                _read_exactly(f, data, path)
                _read_exactly(f, crc, path)
                if f.read(1):
                    raise ValueError(f"chunk {path} is longer than its checksum says")
            _check(data, crc, path)
            return
        stat = os.stat(path)
        key = (str(path), stat.st_ino, stat.st_mtime_ns, stat.st_size)
        with _CACHE_LOCK:
            kept = _CACHE.get(key)
        if kept is None:
            nbytes = math.prod(arr.chunks) * arr.dtype.itemsize
            raw = np.empty(nbytes + 4, dtype=np.uint8)
            with open(path, "rb", buffering=0) as f:
                _read_exactly(f, raw, path)
                if f.read(1):
                    raise ValueError(f"chunk {path} is longer than its checksum says")
            data = raw[:-4]
            _check(data, raw[-4:], path)
            if nbytes <= CACHE_BYTES // 2:
                with _CACHE_LOCK:
                    _CACHE[key] = data
                    while len(_CACHE) > 2:
                        _CACHE.popitem(last=False)
            kept = data
        target[...] = kept.view(arr.dtype).reshape(arr.chunks)[inner]
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):  # as Zarr: unset
        target[...] = arr.metadata.fill_value


# the last chunks read in part, checked: a chunk file replaced (repair, a rerun's write) has a
# new inode and time, so a stale copy is never served
CACHE_BYTES = 64 << 20
_CACHE: OrderedDict[tuple[str, int, int, int], np.ndarray] = OrderedDict()
_CACHE_LOCK = threading.Lock()


def _check(data: np.ndarray, crc: np.ndarray, path: Path) -> None:
    if google_crc32c.value(data) != int(crc.view("<u4")[0]):
        raise ValueError(f"chunk {path}: stored and computed checksum do not match")


def _read_exactly(f: Any, into: np.ndarray, path: Path) -> None:
    view = into.reshape(-1).view(np.uint8).data
    done = 0
    while done < len(view):
        got = f.readinto(view[done:])
        if not got:
            raise ValueError(f"chunk {path} is shorter than its checksum says (truncated)")
        done += got


def all_finite(values: list[np.ndarray], q: np.ndarray | None = None) -> bool:
    """Whether every float in ``values`` (and ``q``) is finite: one vectorised min/max pass
    (NaN propagates into both), where ``np.isfinite`` on float16 is a scalar loop."""
    with one_thread():
        for v in values:
            if v.dtype.kind == "f" and v.size:
                low, high = torch.aminmax(torch.from_numpy(v))
                if not (math.isfinite(float(low)) and math.isfinite(float(high))):
                    return False
    return q is None or bool(np.isfinite(q).all())
