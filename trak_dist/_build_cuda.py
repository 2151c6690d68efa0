"""``trak-dist build-cuda``: compile the CUDA projection kernel where this trak_dist looks for it.

The distribution carries sources, not a binary (a binary is tied to a toolkit, GPU
architectures and a driver only the target machine knows); this runs their own Makefile."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

from trak_dist._resources import cuda_ext_dir
from trak_dist.errors import TrakDistError
from trak_dist.projection import CUDA_LIB_ENV as ENV_VAR
from trak_dist.projection import CudaLibrary, library_path

PROG = "trak-dist build-cuda"
LIB = "libtrak_proj.so"


def _nvcc(given: str | None) -> str:
    nvcc = given or shutil.which("nvcc")
    if nvcc is None and Path("/usr/local/cuda/bin/nvcc").is_file():
        nvcc = "/usr/local/cuda/bin/nvcc"
    if nvcc is None or shutil.which(nvcc) is None:
        raise TrakDistError(
            f"nvcc {'not found' if nvcc is None else f'{nvcc!r} is not an executable'}: install "
            "the CUDA toolkit (any version your driver supports) or pass --nvcc PATH. Without "
            "the kernel trak_dist uses the torch projection (same numbers, slower on GPUs)."
        )
    return nvcc


def _writable(build_dir: Path) -> None:
    try:
        build_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise TrakDistError(f"cannot create {build_dir}: {e.strerror}. {_elsewhere()}") from e
    if not os.access(build_dir, os.W_OK):
        raise TrakDistError(f"{build_dir} is not writable. {_elsewhere()}")


def _elsewhere() -> str:
    return f"Build elsewhere with --build-dir DIR and set {ENV_VAR}=DIR/{LIB} where trak_dist runs."


def build(
    build_dir: Path | None = None,
    nvcc: str | None = None,
    archs: str | None = None,
    ptx_arch: str | None = None,
) -> CudaLibrary:
    """Compile ``libtrak_proj.so`` from the installed sources and load it (no GPU needed).

    Args:
        build_dir: default ``<cuda_ext>/build``, where trak_dist looks.
        nvcc: default ``nvcc`` on PATH, else ``/usr/local/cuda/bin/nvcc``.
        archs, ptx_arch: GPU machine code (``"sm_80 sm_90"``) and PTX to JIT (``"compute_90"``).

    Raises:
        TrakDistError: missing sources, make or nvcc; unwritable directory; failed build; a
            library that does not load.
    """
    src = cuda_ext_dir()
    if not (src / "Makefile").is_file():
        raise TrakDistError(
            f"the kernel's sources are not at {src}: this trak_dist was installed without them. "
            "Reinstall it from a wheel or a clone of the repository."
        )
    make = shutil.which("make")
    if make is None:
        raise TrakDistError("make not found: install it (e.g. apt-get install make).")
    compiler = _nvcc(nvcc)
    out = (build_dir or src / "build").resolve()
    _writable(out)
    cmd = [make, "-C", str(src), f"BUILD_DIR={out}", f"NVCC={compiler}"]
    cmd += [f"ARCHS={archs}"] if archs else []
    cmd += [f"PTX_ARCH={ptx_arch}"] if ptx_arch else []
    # the compiler's own output goes to the terminal: on failure it is what the user needs
    code = subprocess.run(cmd, check=False).returncode
    if code != 0:
        raise TrakDistError(f"building the kernel failed (make exited {code}; output above).")
    return CudaLibrary(out / LIB)


def main(argv: list[str]) -> int:
    """``trak-dist build-cuda [--build-dir DIR] [--nvcc PATH] [--archs …] [--ptx-arch …]``."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Compile the CUDA projection kernel from the sources installed with "
        "trak_dist, where trak_dist looks for it (needs nvcc and make; no GPU).",
    )
    parser.add_argument(
        "--build-dir",
        type=Path,
        default=None,
        help=f"where {LIB} goes (default: where trak_dist looks, {cuda_ext_dir() / 'build'}); "
        f"elsewhere, set {ENV_VAR} to the result",
    )
    parser.add_argument("--nvcc", default=None, help="default: nvcc on PATH or in /usr/local/cuda")
    parser.add_argument("--archs", default=None, help='machine code, default "sm_80 sm_90"')
    parser.add_argument("--ptx-arch", default=None, help="PTX for newer GPUs, default compute_90")
    args = parser.parse_args(argv)
    try:
        lib = build(args.build_dir, args.nvcc, args.archs, args.ptx_arch)
    except TrakDistError as e:  # CudaExtUnavailableError included: built, but does not load
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    print(f"built {lib.path} ({lib.build_info()})")
    if lib.path != library_path():
        print(f"trak_dist looks for the kernel at {library_path()}: set {ENV_VAR}={lib.path}")
    return 0
