"""The store on object storage: what S3 costs a job, and which Zarr client to use.

    python -m benchmarks.store_remote [--reps 4] [--proj-dim 1024] [--rounds 2] [--clients-mb 128]
                                      [--skip-job] [--skip-clients]

Starts its own S3 server (SeaweedFS ``weed mini`` on 127.0.0.1, as the tests do) unless
``--endpoint``/``--bucket`` name one (credentials from ``AWS_*``).

**job**: the same job (the digits MLP at hidden 256, the train set repeated ``--reps`` times,
3 checkpoints, p = ``--proj-dim``, fp16 store, chunks of 256 rows) in this process
(``InProcessExecutor``: every byte and request is counted here), with the store on local disk
and on S3, interleaved ``--rounds`` times (fastest kept). Per stage: seconds, bytes the Zarr
store read and wrote, and for S3 the requests sent (by obstore call: GET includes range reads,
LIST one per listing call, PUT includes the leases). setup = hashing the data, creating the
store, taking its lease; featurize = gradients, projection, writes and commits; reduce = XᵀX
and its eigendecomposition; score = Φ blocks, top-k, S.

**clients**: Zarr's two S3 stores, ``ObjectStore`` (obstore, Rust) and ``FsspecStore`` (s3fs,
Python), against the local disk: two writer processes write ``--clients-mb`` of float16 in
4 MiB chunks (each owning whole chunks), then one reader reads it back; and the time to open a
store. s3fs is not a dependency: ``pip install s3fs`` for its rows.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import os
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from benchmarks._s3_clients import bench_clients
from benchmarks._table import table

STAGES = ("setup", "featurize", "reduce", "score")  # run_pipeline's phases


# ---- counting -----------------------------------------------------------------------------
COUNTS: Counter[str] = Counter()


def _counting(base: type) -> type:
    """``base`` (a Zarr store class) counting what it reads and writes into ``COUNTS``."""

    class Counting(base):  # type: ignore[misc,valid-type]
        async def get(self, key, prototype, byte_range=None):  # type: ignore[no-untyped-def]
            buf = await super().get(key, prototype, byte_range)
            COUNTS["read_bytes"] += 0 if buf is None else len(buf)
            return buf

        async def set(self, key, value):  # type: ignore[no-untyped-def]
            COUNTS["written_bytes"] += len(value)
            await super().set(key, value)

    return Counting


def install_counters() -> None:
    """Count the Zarr store's bytes (local and S3) and obstore's requests (S3: every request
    this process sends, leases and listings included)."""
    import obstore
    from zarr.storage import LocalStore

    from trak_dist.store import _metadata, _object_store, _store
    from trak_dist.store._object_store import RemoteZarrStore

    local, remote = _counting(LocalStore), _counting(RemoteZarrStore)
    original = _object_store.open_zarr

    def open_zarr(where: str, options: Any = None, read_only: bool = False) -> Any:
        store = original(where, options, read_only)
        if isinstance(store, RemoteZarrStore):
            return remote(store.store, store.root, store.options, read_only=read_only)
        return local(store.root, read_only=read_only)

    for module in (_store, _metadata):
        module.open_zarr = open_zarr  # type: ignore[attr-defined]
    verbs = {
        "get": "GET", "get_async": "GET", "get_range": "GET", "get_range_async": "GET",
        "get_ranges": "GET", "get_ranges_async": "GET", "head": "HEAD", "head_async": "HEAD",
        "put": "PUT", "put_async": "PUT", "delete": "DELETE", "delete_async": "DELETE",
        "list": "LIST", "list_with_delimiter": "LIST", "list_with_delimiter_async": "LIST",
    }  # fmt: skip
    for name, verb in verbs.items():
        fn = getattr(obstore, name)

        def counted(*a: Any, _fn: Any = fn, _verb: str = verb, **k: Any) -> Any:
            COUNTS[_verb] += 1
            return _fn(*a, **k)

        setattr(obstore, name, counted)


# ---- the job ------------------------------------------------------------------------------
def job(store: str, reps: int, proj_dim: int, checkpoints: list[str]) -> Any:
    from benchmarks.pipeline import tiled_train
    from trak_dist.config import DataConfig, FeaturizeConfig, JobConfig, ModelConfig, StoreConfig
    from trak_dist.examples import digits

    return JobConfig(
        proj_dim=proj_dim,
        lambda_reg="auto",
        model=ModelConfig(kwargs={"hidden": 256}, checkpoints=checkpoints),
        data=DataConfig(train=functools.partial(tiled_train, reps), targets=digits.target_set),
        featurize=FeaturizeConfig(micro_batch=256, shard_rows=1024),
        store=StoreConfig(path=store, chunk_rows=256),
        progress=False,
        report=None,
    )


def run_staged(cfg: Any) -> dict[str, dict[str, float]]:
    """``run_pipeline`` in process; seconds and ``COUNTS`` per stage."""
    from trak_dist.pipeline import InProcessExecutor, run_pipeline

    marks: list[tuple[str, float, Counter[str]]] = []

    def mark(stage: str) -> None:
        marks.append((stage, time.perf_counter(), Counter(COUNTS)))

    class Staged(InProcessExecutor):
        def start(self, cfg: Any, prep: Any) -> None:
            mark("featurize")
            super().start(cfg, prep)

        def factorize(self, ids: list[int], dims: list[int]) -> Any:
            mark("reduce")
            return super().factorize(ids, dims)

        def score(self, request: Any) -> Any:
            mark("score")
            return super().score(request)

    mark("setup")
    run_pipeline(cfg, Staged())
    mark("end")
    out = {}
    for (stage, t0, c0), (_, t1, c1) in itertools.pairwise(marks):
        out[stage] = {"s": t1 - t0, **{k: float(c1[k] - c0[k]) for k in c1}}
    return out


def train_checkpoints(cache: Path, n: int = 3) -> list[str]:
    import torch

    from trak_dist.examples import digits

    x, y = digits.train_set().tensors
    out = []
    torch.manual_seed(0)
    model = digits.make_model(hidden=256)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for k in range(n):
        for _ in range(20):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        path = cache / f"mlp256_{k}.pt"
        torch.save(model.state_dict(), path)
        out.append(str(path))
    return out


def bench_job(args: argparse.Namespace, url: str, root: Path) -> None:
    ckpts = train_checkpoints(root)
    best: dict[str, dict[str, dict[str, float]]] = {}
    for r in range(args.rounds):
        for where in ("local", "S3"):
            path = str(root / f"local-{r}.zarr") if where == "local" else f"{url}-{r}.zarr"
            got = run_staged(job(path, args.reps, args.proj_dim, ckpts))
            keep = best.setdefault(where, got)
            for stage, v in got.items():
                if v["s"] < keep[stage]["s"]:
                    keep[stage] = v
    rows = []
    for stage in (*STAGES, "total"):

        def get(where: str, key: str, stage: str = stage) -> float:
            if stage == "total":
                return sum(best[where][s].get(key, 0.0) for s in STAGES)
            return best[where][stage].get(key, 0.0)

        reqs = " ".join(
            f"{verb} {int(get('S3', verb))}"
            for verb in ("GET", "PUT", "HEAD", "LIST", "DELETE")
            if get("S3", verb)
        )
        rows.append([
            stage, round(get("local", "s"), 2), round(get("S3", "s"), 2),
            f"{get('S3', 's') / max(get('local', 's'), 1e-9):.2f}×",
            _mb(get("local", "read_bytes")), _mb(get("S3", "read_bytes")),
            _mb(get("local", "written_bytes")), _mb(get("S3", "written_bytes")), reqs,
        ])  # fmt: skip
    n = 1500 * args.reps
    print(
        f"\njob: n={n} train rows (digits × {args.reps}), m=297 targets, 3 checkpoints, "
        f"p={args.proj_dim}, fp16, in process; fastest of {args.rounds} interleaved rounds\n"
    )
    print(table(
        ["stage", "local s", "S3 s", "S3 / local", "local MB read", "S3 MB read",
         "local MB written", "S3 MB written", "S3 requests"],
        rows,
    ))  # fmt: skip


def _mb(nbytes: float) -> float:
    return round(nbytes / 1e6, 2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=4)
    ap.add_argument("--proj-dim", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--clients-mb", type=int, default=128)
    ap.add_argument("--skip-job", action="store_true")
    ap.add_argument("--skip-clients", action="store_true")
    ap.add_argument("--endpoint", help="an S3 endpoint to use instead of starting SeaweedFS")
    ap.add_argument("--bucket", default="trakbucket")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="store_remote-") as tmp:
        root = Path(tmp)
        server = None
        if args.endpoint is None:
            from tests.fixtures.s3 import S3Server

            server = S3Server(root / "weed").start()
            os.environ.update(server.env())
        else:
            os.environ["AWS_ENDPOINT_URL"] = args.endpoint
        url = f"s3://{args.bucket}/bench-{uuid.uuid4().hex[:8]}/store"
        try:
            print(f"load average before: {os.getloadavg()[0]:.1f} ({os.cpu_count()} CPUs)")
            if not args.skip_clients:
                bench_clients(args.rounds, args.clients_mb, url, root)
            if not args.skip_job:
                install_counters()
                bench_job(args, url, root)
            print(f"load average after: {os.getloadavg()[0]:.1f}")
        finally:
            if server is not None:
                server.stop()


if __name__ == "__main__":
    main()
