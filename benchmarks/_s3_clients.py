"""``benchmarks.store_remote``'s clients part: Zarr's ``ObjectStore`` (obstore) and
``FsspecStore`` (s3fs) against the local disk, with the chunk pattern workers use."""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks._table import table

COLS, CHUNK_ROWS = 2048, 1024  # 4 MiB float16 chunks


def open_client(kind: str, where: str, read_only: bool = False) -> Any:
    import zarr

    if kind == "local disk":
        return zarr.storage.LocalStore(where, read_only=read_only)
    if kind == "obstore (ObjectStore)":
        from trak_dist.store._object_store import open_zarr

        return open_zarr(where, read_only=read_only)
    return zarr.storage.FsspecStore.from_url(
        where, read_only=read_only,
        storage_options={"endpoint_url": os.environ["AWS_ENDPOINT_URL"]},
    )  # fmt: skip


def _chunk(i: int) -> np.ndarray:
    rng = np.random.default_rng(1000 + i)
    return rng.standard_normal((CHUNK_ROWS, COLS), dtype=np.float32).astype(np.float16)


def _writer(kind: str, where: str, p: int, n: int, q: Any) -> None:
    import zarr

    arr = zarr.open_array(open_client(kind, where), path="x", mode="r+")
    mine = list(range(p * n // 2, (p + 1) * n // 2))
    data = {i: _chunk(i) for i in mine}
    t0 = time.perf_counter()
    for j in range(0, len(mine), 4):  # 4 chunks per assignment: several PUTs in flight
        ids = mine[j : j + 4]
        arr[ids[0] * CHUNK_ROWS : (ids[-1] + 1) * CHUNK_ROWS] = np.concatenate(
            [data[i] for i in ids]
        )
    q.put((t0, time.perf_counter()))


def client_round(kind: str, where: str, mb: int) -> list[float]:
    import zarr
    from zarr.core.sync import sync

    n = max(2, mb * 2**20 // (CHUNK_ROWS * COLS * 2))
    t = time.perf_counter()
    store = open_client(kind, where)
    sync(store.exists("zarr.json"))  # opened = able to answer a first request
    opened = time.perf_counter() - t
    root = zarr.open_group(store, mode="w")
    root.create_array(
        "x", shape=(n * CHUNK_ROWS, COLS), chunks=(CHUNK_ROWS, COLS), dtype="float16",
        compressors=None, fill_value=0,
    )  # fmt: skip
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_writer, args=(kind, where, p, n, q)) for p in range(2)]
    for proc in procs:
        proc.start()
    spans = [q.get() for _ in procs]
    for proc in procs:
        proc.join()
    nbytes = n * CHUNK_ROWS * COLS * 2
    write_s = max(s[1] for s in spans) - min(s[0] for s in spans)
    t = time.perf_counter()
    back = zarr.open_array(open_client(kind, where, read_only=True), path="x", mode="r")[:]
    read_s = time.perf_counter() - t
    if not np.array_equal(back[:CHUNK_ROWS], _chunk(0)):
        raise RuntimeError(f"{kind}: the data read back differ")
    return [opened, nbytes / 1e6 / write_s, nbytes / 1e6 / read_s]


def bench_clients(rounds: int, mb: int, url: str, root: Path) -> None:
    """Print the table of ``store_remote``'s "clients" part (its docstring)."""
    import trak_dist.store._object_store  # noqa: F401  (imported before any store is timed)

    kinds = ["local disk", "obstore (ObjectStore)"]
    try:
        import s3fs  # noqa: F401

        kinds.append("fsspec (FsspecStore, s3fs)")
    except ImportError:
        print("s3fs is not installed: no fsspec row (pip install s3fs)")
    results: dict[str, list[list[float]]] = {k: [] for k in kinds}
    for r in range(rounds):
        for kind in kinds:
            local = str(root / f"clients-{r}.zarr")
            where = local if kind == "local disk" else f"{url}-c{r}-{len(results)}-{kind[:3]}.zarr"
            results[kind].append(client_round(kind, where, mb))
    rows = []
    for kind, runs in results.items():
        arr = np.array(runs)
        rows.append([
            kind, f"{arr[:, 0].min():.3f}", f"{arr[:, 1].min():.0f}–{arr[:, 1].max():.0f}",
            f"{arr[:, 2].min():.0f}–{arr[:, 2].max():.0f}",
        ])  # fmt: skip
    print(
        f"\nclients: {mb} MB float16 in 4 MiB chunks, 2 writer processes, "
        f"1 reader; ranges over {rounds} rounds\n"
    )
    print(table(["client", "open s (best)", "write MB/s", "read MB/s"], rows))
