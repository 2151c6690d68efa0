"""Section ``scoring``: the pipeline's score step on the GPU at n = 1M train rows, m = 10k
targets, p = 4096, one checkpoint, top-k only (S would be 40 GB), against a plain ``torch.mm``
of the same shapes.

The store (fp16 X, chunks of 4096 rows; in /dev/shm when it has room) is filled with random
rows, XᵀX computed on the GPU in fp64, rather than featurised, so the section times scoring
alone: ``Reducer.score`` (the in-process executor's score step: K⁻¹, Y, every block on the GPU
— reading X, ``addmm``, the exact top-k merge — and the final merge), with the defaults of
``ScoringConfig`` (train blocks of 4096 rows, target blocks of 1024, 1 GiB of memory). The
yardstick: ``torch.mm`` of [65536, p] × [p, m] float32 on the GPU (the scorer's dtype), its
FLOP rate against the score step's 2·n·m·p / seconds. Fewer than 1M rows (said so) when one
probe piece's write rate says the store could not be written and read back within the budget.
Then where a score block's time goes, on the first ``[65536, p]`` rows, scaled to n: reading X
and Q from the store, the copy to the device, the ``addmm``s alone, the finite check's sync per
block, and the two top-k merges (``breakdown``). The dry run: n = 4096, m = 256, p = 64 on the
CPU."""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks.device._section import Section, seconds_per_call, sync
from trak_dist.pipeline import Reducer
from trak_dist.scoring import ScoreRequest, ScoringConfig
from trak_dist.scoring._topk import merge_above
from trak_dist.store import FeatureSpec, FeatureStore

SIZES = {"gpu": (1_000_000, 10_000, 4096, 4096, 65536), "dry": (4096, 256, 64, 256, 1024)}
LAMBDA, EXP = 0.1, "targets"


def spec(n: int, p: int, chunk: int) -> FeatureSpec:
    return FeatureSpec(
        proj_dim=p,
        projection="rademacher",
        seed=0,
        grad_wrt=None,
        model_output="synthetic",
        grad_dim=p,
        train_size=n,
        dataset_fingerprint="synthetic",
        dtype="float16",
        chunk_rows=chunk,
    )


def scratch(nbytes: int) -> Path:
    """A folder for the store: /dev/shm when it holds 1.5× ``nbytes``, else the temp dir."""
    shm = Path("/dev/shm")
    base = shm if shm.is_dir() and shutil.disk_usage(shm).free > 1.5 * nbytes else None
    return Path(tempfile.mkdtemp(prefix="trak_device_scoring_", dir=base))


def fill(s: Section, store: FeatureStore, n: int, m: int, p: int, piece: int) -> bool:
    """Random train rows and Q (XᵀX on the device), random targets; False if out of time."""
    gen = torch.Generator(s.device).manual_seed(0)
    rows = store.ensure_checkpoint(0)
    xtx = torch.zeros(p, p, dtype=torch.float64, device=s.device)
    t0 = time.perf_counter()
    for r0 in range(0, n, piece):
        if s.out_of_time(f"writing train rows from {r0} (and scoring)", 15):
            return False
        x = torch.randn(min(piece, n - r0), p, generator=gen, device=s.device).half()
        xtx += x.double().T @ x.double()
        q = torch.rand(x.shape[0], generator=gen, device=s.device) * 0.9 + 0.1
        rows.write(r0, x.cpu().numpy(), q.cpu().numpy())
    rows.commit(0, n)
    store.write_xtx(0, xtx.cpu().numpy())
    seconds = time.perf_counter() - t0
    s.write(
        f"- store filled: {n} × {p} fp16 train rows in {seconds:.1f} s "
        f"({n * p * 2 / seconds / 1e9:.3g} GB/s written)"
    )
    store.ensure_experiment(EXP, m, None)
    targets = store.ensure_target_checkpoint(EXP, 0)
    targets.write(0, torch.randn(m, p, generator=gen, device=s.device).cpu().numpy())
    targets.commit(0, m)
    return True


def rows_that_fit(s: Section, root: Path, n: int, p: int, chunk: int, piece: int) -> int:
    """n, or fewer rows (whole pieces) if writing them, then reading them back in the score
    step, would not fit the budget at the write rate of one probe piece."""
    probe = FeatureStore.create_or_open(root / "probe.zarr", spec(piece, p, chunk))
    x = np.zeros((piece, p), np.float16)
    t0 = time.perf_counter()
    probe.ensure_checkpoint(0).write(0, x, np.ones(piece, np.float32))
    per_piece = time.perf_counter() - t0
    shutil.rmtree(root / "probe.zarr")
    # writing and the score step's read cost about the same; keep a third of the rest for both
    fit = int((s.left() - 30) / 3 / per_piece) * piece  # 30 s: the rest and the breakdown
    s.write(
        f"- probe: {piece} rows written in {per_piece:.2f} s "
        f"({piece * p * 2 / per_piece / 1e9:.3g} GB/s)"
    )
    if fit < n:
        s.write(
            f"- **n reduced from {n} to {max(fit, piece)}**: the whole store would not be "
            "written and read back within the section's budget at that rate"
        )
    return max(min(n, fit), piece)


def breakdown(s: Section, store: FeatureStore, n: int, m: int, p: int, rows: int) -> None:
    """Seconds of each part of a score block's loop (``scoring/_score_block.py``: train blocks
    of 4096 rows, target blocks of 1024, k = 10) over the first ``rows`` rows, scaled to n."""
    cfg = ScoringConfig(exp_name=EXP)
    tb, cb, k = cfg.train_block, cfg.target_block, cfg.topk
    rs = store.train_rows(0)
    gen = torch.Generator(s.device).manual_seed(2)
    y = torch.randn(m, p, generator=gen, device=s.device)
    spans = [(r0, min(rows, r0 + tb)) for r0 in range(0, rows, tb)]
    parts: dict[str, float] = {}

    def timed(name: str, fn) -> object:
        sync(s.device)
        t0 = time.perf_counter()
        out = fn()
        sync(s.device)
        parts[name] = (time.perf_counter() - t0) * n / rows
        return out

    host = timed(
        "read X and Q from the store",
        lambda: [(rs.read(a, b, p), rs.read_q(a, b)) for a, b in spans],
    )
    xs = timed(
        "copy to the device, as float32",
        lambda: [torch.as_tensor(x, device=s.device).float() for x, _ in host],
    )

    def products(check: bool) -> None:
        for x in xs:
            for c0 in range(0, m, cb):
                acc = torch.zeros(x.shape[0], min(cb, m - c0), device=s.device)
                acc.addmm_(x, y[c0 : c0 + cb].T)
                if check:
                    bool(torch.isfinite(acc.sum()))

    timed("addmm alone (no sync per block)", lambda: products(False))
    timed("addmm + the finite check (a sync per block)", lambda: products(True))

    best: dict = {}
    worst: dict = {}

    def merges() -> None:
        for i, x in enumerate(xs):
            for j, c0 in enumerate(range(0, m, cb)):
                block = x @ y[c0 : c0 + cb].T
                best[j] = merge_above(best.get(j), block, spans[i][0], k, largest=True)
                worst[j] = merge_above(worst.get(j), block, spans[i][0], k, largest=False)

    timed("addmm + both top-k merges", merges)
    s.write(f"\nWhere a block's time goes ({rows} rows timed, scaled to n = {n}):")
    s.table(["part", "seconds at n"], [[name, sec] for name, sec in parts.items()])
    for name, sec in parts.items():
        s.record("part: " + name, sec)


def main() -> int:
    s = Section()
    n, m, p, chunk, mm_rows = SIZES["gpu" if s.gpu else "dry"]
    root = scratch(n * p * 2)
    try:
        n = rows_that_fit(s, root, n, p, chunk, min(mm_rows, n))
        s.write(
            f"- n = {n}, m = {m}, p = {p}, one checkpoint, λ = {LAMBDA}, top-k only; store "
            f"in {root.parent}"
        )
        store = FeatureStore.create_or_open(root / "s.zarr", spec(n, p, chunk))
        if not fill(s, store, n, m, p, min(mm_rows, n)):
            return s.done()
        request = ScoreRequest(ScoringConfig(exp_name=EXP, write_scores="topk"), (0,), p, LAMBDA)
        t0 = time.perf_counter()
        result = Reducer(store, s.device).score(request)
        seconds = time.perf_counter() - t0
        flops = 2.0 * n * m * p
        gen = torch.Generator(s.device).manual_seed(1)
        a = torch.randn(mm_rows, p, generator=gen, device=s.device)
        b = torch.randn(p, m, generator=gen, device=s.device)
        mm = 2.0 * mm_rows * p * m / seconds_per_call(lambda: torch.mm(a, b), s.device, min_s=1.0)
        rate = flops / seconds
        block_s = max(result.block_seconds, 1e-9)
        mm_name = f"torch.mm [{mm_rows}, {p}] × [{p}, {m}] fp32, scaled to n"
        s.table(
            ["", "seconds", "TFLOP/s", "÷ torch.mm"],
            [
                ["score step (Reducer.score)", seconds, rate / 1e12, rate / mm],
                [
                    "its blocks' compute (summed)",
                    block_s,
                    flops / block_s / 1e12,
                    flops / block_s / mm,
                ],
                [mm_name, flops / mm, mm / 1e12, 1.0],
            ],
        )
        s.write(
            f"- X read {result.x_passes} time(s) ({result.bytes_read / 2**30:.1f} GiB by the "
            f"blocks); {result.blocks} blocks; super-block {result.super_block} targets"
        )
        top = store.score_set(EXP, result.variant).read_topk()["proponents_idx"]
        if top.shape != (m, 10) or not np.all((top >= 0) & (top < n)):
            s.fail(f"the top-k has shape {top.shape} or rows outside [0, {n})")
        s.record("n", n)
        s.record("score_seconds", seconds)
        s.record("score_vs_mm", rate / mm)
        s.record("blocks_vs_mm", flops / block_s / mm)
        if not s.out_of_time("the breakdown of a block's time", 10):
            breakdown(s, store, n, m, p, min(mm_rows, n))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return s.done()


if __name__ == "__main__":
    sys.exit(main())
