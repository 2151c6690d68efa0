"""Section ``env``: the machine, the versions that matter, and the dense bf16 peak measured here
(one big bf16 matmul, the yardstick of the projection section's share of the peak)."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess
import sys

import torch

from benchmarks.device._section import Section, seconds_per_call
from benchmarks.gpu_projection import _peak_tflops

PACKAGES = (
    "numpy",
    "transformers",
    "peft",
    "safetensors",
    "scipy",
    "pytest",
    "zarr",
    "numcodecs",
    "hydra-core",
    "omegaconf",
    "submitit",
)


def _nvidia_smi() -> str:
    try:
        out = subprocess.run(
            [
                "nvidia-smi",
                "--query-gpu=name,driver_version,memory.total,clocks.max.sm",
                "--format=csv,noheader",
            ],
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError) as e:
        return f"n/a ({type(e).__name__})"
    return out.stdout.strip()


def _versions(s: Section) -> None:
    s.write(f"- Python {sys.version.split()[0]}, {platform.platform()}, {os.cpu_count()} CPUs")
    s.write(
        f"- torch {torch.__version__} (CUDA {torch.version.cuda}, cuDNN "
        f"{torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else 'n/a'})"
    )
    found = []
    for name in PACKAGES:
        try:
            found.append(f"{name} {importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            found.append(f"{name} missing")
    s.write("- " + ", ".join(found))
    s.write(
        f"- nvcc: {s.state.get('setup', {}).get('nvcc', 'n/a')}; kernel built for "
        f"{s.state.get('setup', {}).get('kernel_arch', 'n/a')}"
    )
    from trak_dist.projection._cuda import load_library

    s.write(f"- kernel library: {load_library().build_info()}")


def _device(s: Section) -> str:
    if not s.gpu:
        s.skip("GPU, driver, SMs", "no GPU in the dry run")
        s.record("device", f"CPU ({platform.processor() or platform.machine()}), dry run")
        return "cpu"
    props = torch.cuda.get_device_properties(0)
    name = torch.cuda.get_device_name(0)
    s.write(
        f"- GPU: {name}, capability {props.major}.{props.minor}, {props.multi_processor_count}"
        f" SMs, {props.total_memory / 2**30:.1f} GiB; nvidia-smi: {_nvidia_smi()}"
    )
    s.record("device", f"{name} ({props.total_memory / 2**30:.0f} GiB)")
    s.record("sms", props.multi_processor_count)
    return name


def _peak(s: Section, name: str) -> None:
    """The dense bf16 matmul rate here: [n, n] × [n, n], n = 8192 on a GPU (256 in the dry
    run), random data, the best of the timing's repetitions averaged after a warm-up."""
    n = 8192 if s.gpu else 256
    gen = torch.Generator(device=s.device).manual_seed(0)
    a = torch.randn(n, n, generator=gen, device=s.device).to(torch.bfloat16)
    b = torch.randn(n, n, generator=gen, device=s.device).to(torch.bfloat16)
    seconds = seconds_per_call(lambda: a @ b, s.device, min_s=1.0, max_reps=200)
    tflops = 2 * n**3 / seconds / 1e12
    sheet = _peak_tflops(name, None) if s.gpu else None
    s.write(
        f"- dense bf16 peak measured: {n}×{n}×{n} matmul, {tflops:.3g} TFLOP/s"
        + (f" ({tflops / sheet:.0%} of the data sheet's {sheet})" if sheet else "")
    )
    s.record("bf16_peak_tflops", tflops)
    if sheet:
        s.record("bf16_sheet_tflops", sheet)


def main() -> int:
    s = Section()
    _versions(s)
    name = _device(s)
    _peak(s, name)
    return s.done()


if __name__ == "__main__":
    sys.exit(main())
