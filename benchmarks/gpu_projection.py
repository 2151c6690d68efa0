"""Throughput of the CUDA projection kernel, side by side with fast_jl and a torch matmul ceiling.

    make cuda && python benchmarks/gpu_projection.py    # the full grid below
    python benchmarks/gpu_projection.py --quick         # B ∈ {8, 128}, d = 1e7, p ∈ {512, 8192}
    python benchmarks/gpu_projection.py --B 128 --d 1e8 --p 2048 --dtype fp32 --markdown t.md

Grid: B ∈ {8, 32, 128, 512}, d ∈ {1e6, 1e7, 1e8}, p ∈ {512, 2048, 8192}, one projection of a
[B, d] gradient per measurement (CUDA events, one warm-up call, repeated for ≥ 0.3 s).

Columns: GB/s of gradient read and effective TFLOP/s (2·B·d·p / time) of our kernel, its share of
the GPU's dense bf16 tensor-core peak; torch ``G @ P`` with P pre-generated in bf16 (a ceiling for
generating P on the fly; for d·p too large to hold, timed on a d' = 2 GiB / (2p) slice and scaled
by d/d', marked *); fast_jl on the same gradients in fp16 (it takes no bf16) and our speed-up.
Rows whose gradients do not fit in GPU memory say so.

fast_jl (traker's CUDA projector) is built from its PyPI sdist on the GPU machine, against the
installed torch and nvcc; build isolation would pull another torch, hence the flag:

    pip install --no-build-isolation fast_jl==0.1.3

Without it the fast_jl column reads "n/a (not installed)". Without a GPU the script prints one
line and exits 0.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch

# Dense bf16 tensor-core TFLOP/s with fp32 accumulation, from NVIDIA's data sheets.
BF16_PEAK_TFLOPS = (
    ("H200", 989.4),
    ("H100 NVL", 835.0),
    ("H100 PCIe", 756.5),
    ("H100", 989.4),  # SXM ("H100 80GB HBM3")
    ("GH200", 989.4),
    ("A100", 312.0),
    ("L40S", 362.1),
    ("A10G", 125.0),
    ("L4", 121.0),
)
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


@dataclass
class Row:
    batch: int
    d: int
    p: int
    cells: dict[str, str]


def _peak_tflops(name: str, override: float | None) -> float | None:
    if override:
        return override
    for key, tflops in BF16_PEAK_TFLOPS:
        if key in name:
            return tflops
    return None


def _time(fn: Callable[[], Any], min_seconds: float = 0.3, max_reps: int = 20) -> float:
    """Seconds per call of ``fn`` on the current stream, after one warm-up call."""
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    once = start.elapsed_time(end) / 1e3
    reps = max(1, min(max_reps, int(min_seconds / max(once, 1e-6))))
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / reps


def _fast_jl() -> tuple[Any, str]:
    try:
        import fast_jl
    except Exception as e:  # ImportError, or an undefined symbol from a torch ABI mismatch
        return None, f"n/a (not installed: {type(e).__name__})"
    return fast_jl, ""


def _fits(nbytes: int, reserve: int = 2 * 2**30) -> bool:
    free, _ = torch.cuda.mem_get_info()
    return nbytes + reserve <= free


def _matmul_ceiling(g: torch.Tensor, p: int, rows: int) -> tuple[float, bool]:
    """Seconds for ``g @ P`` (bf16, P pre-generated), scaled from ``rows`` rows if fewer than d."""
    d = g.shape[1]
    gen = torch.Generator(device=g.device).manual_seed(0)
    sign = torch.randint(0, 2, (rows, p), generator=gen, device=g.device, dtype=torch.int8)
    proj = (1 - 2 * sign).to(torch.bfloat16)
    del sign
    gs = g[:, :rows].to(torch.bfloat16).contiguous()
    seconds = _time(partial(torch.matmul, gs, proj)) * d / rows
    del proj, gs
    return seconds, rows < d


def _measure(
    batch: int,
    d: int,
    p: int,
    dtype: torch.dtype,
    peak: float | None,
    fast_jl: Any,
    fast_jl_reason: str,
    projector_cls: Any,
    max_p_bytes: int,
) -> Row:
    cells: dict[str, str] = {}
    elem = torch.finfo(dtype).bits // 8
    g_bytes = batch * d * elem
    flops = 2.0 * batch * d * p
    if not _fits(g_bytes):
        free = torch.cuda.mem_get_info()[0]
        reason = f"skipped: G needs {g_bytes / 2**30:.1f} GiB, {free / 2**30:.1f} GiB free"
        return Row(batch, d, p, {"ours GB/s": reason})
    gen = torch.Generator(device="cuda").manual_seed(0)
    g = torch.randn(batch, d, generator=gen, device="cuda", dtype=dtype)

    proj = projector_cls(d, p, seed=0, device="cuda")
    ours = _time(partial(proj.project, g, 0))
    cells["ours GB/s"] = f"{g_bytes / ours / 1e9:.0f}"
    cells["ours TFLOP/s"] = f"{flops / ours / 1e12:.1f}"
    cells["% bf16 peak"] = f"{100 * flops / ours / 1e12 / peak:.0f}" if peak else "n/a"

    rows = min(d, max(1, max_p_bytes // (2 * p)))
    if _fits(3 * rows * p + 2 * batch * rows):
        seconds, scaled = _matmul_ceiling(g, p, rows)
        cells["matmul TFLOP/s"] = f"{flops / seconds / 1e12:.1f}" + ("*" if scaled else "")
    else:
        cells["matmul TFLOP/s"] = "n/a (memory)"

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    scratch = 4 * (-(-batch // 32) * 32) * sms * p  # fast_jl's [B, SMs, p] fp32 buffer
    if fast_jl is None:
        cells["fast_jl TFLOP/s"] = fast_jl_reason
    elif not _fits(scratch + (g_bytes if dtype == torch.bfloat16 else 0)):
        cells["fast_jl TFLOP/s"] = f"n/a (its scratch needs {scratch / 2**30:.1f} GiB)"
    else:
        if dtype == torch.bfloat16:
            g = g.to(torch.float16)  # fast_jl takes fp16/fp32 only; the bf16 copy is freed
        size = 8 if batch <= 8 else 16 if batch <= 16 else 32
        fn = getattr(fast_jl, f"project_rademacher_{size}")
        try:
            theirs = _time(partial(fn, g, p, 0, sms))
            cells["fast_jl TFLOP/s"] = f"{flops / theirs / 1e12:.1f}"
            cells["ours / fast_jl"] = f"{theirs / ours:.1f}×"
        except RuntimeError as e:
            cells["fast_jl TFLOP/s"] = f"n/a (error: {str(e).splitlines()[0][:60]})"
    del g, proj
    torch.cuda.empty_cache()
    return Row(batch, d, p, cells)


COLUMNS = (
    "ours GB/s",
    "ours TFLOP/s",
    "% bf16 peak",
    "matmul TFLOP/s",
    "fast_jl TFLOP/s",
    "ours / fast_jl",
)


def _table(rows: list[Row]) -> str:
    head = "| B | d | p | " + " | ".join(COLUMNS) + " |"
    rule = "|" + "---|" * (3 + len(COLUMNS))
    lines = [head, rule]
    for r in rows:
        cells = [r.cells.get(c, "") for c in COLUMNS]
        lines.append(f"| {r.batch} | {r.d:.0e} | {r.p} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--B", type=int, nargs="+", default=[8, 32, 128, 512])
    ap.add_argument("--d", type=float, nargs="+", default=[1e6, 1e7, 1e8])
    ap.add_argument("--p", type=int, nargs="+", default=[512, 2048, 8192])
    ap.add_argument("--quick", action="store_true", help="B 8 128, d 1e7, p 512 8192")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="bf16", help="gradient dtype")
    ap.add_argument("--peak-tflops", type=float, default=None, help="bf16 peak if not known")
    ap.add_argument("--max-p-gib", type=float, default=2.0, help="largest pre-generated P")
    ap.add_argument("--markdown", type=Path, default=None, help="also write the table here")
    args = ap.parse_args(argv)
    if args.quick:
        args.B, args.d, args.p = [8, 128], [1e7], [512, 8192]
    return args


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    if not torch.cuda.is_available():
        print("no CUDA GPU visible (torch.cuda.is_available() is False); nothing to benchmark.")
        return 0
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from trak_dist.errors import CudaExtUnavailableError
    from trak_dist.projection._cuda import CudaProjector, load_library

    try:
        info = load_library().build_info()
        CudaProjector(1000, 128, device="cuda")  # self-check once, before any timing
    except CudaExtUnavailableError as e:
        print(f"the CUDA projector cannot run here: {e}")
        return 1
    name = torch.cuda.get_device_name(0)
    peak = _peak_tflops(name, args.peak_tflops)
    fast_jl, reason = _fast_jl()
    header = [
        f"device: {name} ({torch.cuda.get_device_properties(0).multi_processor_count} SMs), "
        f"bf16 peak {peak or 'unknown'} TFLOP/s",
        f"torch {torch.__version__} (CUDA {torch.version.cuda}); library: {info}",
        f"gradients: {args.dtype}; fast_jl: {'fp16 copy' if args.dtype == 'bf16' else args.dtype}",
        f"command: python benchmarks/gpu_projection.py {' '.join(argv or sys.argv[1:])}",
    ]
    print("\n".join(header), flush=True)
    rows = []
    started = time.time()
    for batch in args.B:
        for d in (int(x) for x in args.d):
            for p in args.p:
                row = _measure(
                    batch,
                    d,
                    p,
                    DTYPES[args.dtype],
                    peak,
                    fast_jl,
                    reason,
                    CudaProjector,
                    int(args.max_p_gib * 2**30),
                )
                rows.append(row)
                print(f"  B={batch} d={d:.0e} p={p}: {row.cells}", flush=True)
    table = _table(rows)
    print(table)
    print(f"({time.time() - started:.0f} s)")
    if args.markdown:
        args.markdown.write_text("\n".join(f"- {h}" for h in header) + "\n\n" + table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
