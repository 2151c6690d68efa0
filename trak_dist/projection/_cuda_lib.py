"""ctypes bindings of ``cuda_ext/build/libtrak_proj.so`` (``make cuda`` / ``trak-dist
build-cuda``): a plain C ABI with a static CUDA runtime, loadable without a GPU."""

from __future__ import annotations

import ctypes
import os
import threading
from pathlib import Path

import torch

from trak_dist._resources import cuda_ext_dir
from trak_dist.errors import CudaExtUnavailableError

ENV_VAR = "TRAK_DIST_CUDA_LIB"
ABI_VERSION = 1
# the build directory of the kernel sources this trak_dist ships with (_resources.cuda_ext_dir)
DEFAULT_LIB = cuda_ext_dir() / "build" / "libtrak_proj.so"
BUILD_HINT = "`trak-dist build-cuda` (`make cuda` in a checkout; needs nvcc)"
DTYPE_CODES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
MIN_CAPABILITY = (8, 0)

_u64, _i64, _u32, _int, _ptr = (
    ctypes.c_uint64,
    ctypes.c_int64,
    ctypes.c_uint32,
    ctypes.c_int,
    ctypes.c_void_p,
)
_SIGNATURES: dict[str, tuple[type | None, list[type]]] = {
    "trak_proj_abi_version": (_int, []),
    "trak_proj_build_info": (ctypes.c_char_p, []),
    "trak_proj_last_error": (ctypes.c_char_p, []),
    "trak_proj_workspace_bytes": (_i64, [_i64, _i64, _i64]),
    "trak_proj_rademacher": (
        _int,
        [_ptr, _int, _i64, _i64, _i64, _u64, _ptr, _i64, _i64, _u64, _u32, _int, _ptr, _i64, _ptr],
    ),
    "trak_proj_rademacher_signs_host": (_int, [_u64, _u32, _u64, _i64, _u64, _i64, _ptr]),
    "trak_proj_p_tile_host": (_int, [_u64, _u32, _u64, _u32, _int, _ptr]),
    "trak_proj_split_f32_host": (_int, [_ptr, _i64, _int, _ptr]),
}


class CudaLibrary:
    """Typed access to the shared library ``path`` (loading needs no GPU); raises
    CudaExtUnavailableError when it cannot be loaded or has another ABI version."""

    def __init__(self, path: Path) -> None:
        try:
            lib = ctypes.CDLL(str(path))
        except OSError as e:
            raise CudaExtUnavailableError(
                f"could not load the CUDA projection library {path}: {e}. Rebuild it with "
                f"{BUILD_HINT}."
            ) from e
        for name, (restype, argtypes) in _SIGNATURES.items():
            try:
                fn = getattr(lib, name)
            except AttributeError as e:
                raise CudaExtUnavailableError(
                    f"{path} lacks the symbol {name}: it is not a trak_proj library or a stale "
                    f"one. Rebuild it with {BUILD_HINT}."
                ) from e
            fn.restype = restype
            fn.argtypes = argtypes
        found = lib.trak_proj_abi_version()
        if found != ABI_VERSION:
            raise CudaExtUnavailableError(
                f"{path} has ABI version {found}; this trak_dist needs {ABI_VERSION}. Rebuild it "
                f"with {BUILD_HINT}."
            )
        self.path = path
        self._lib = lib

    def build_info(self) -> str:
        """What the library was built with (ABI, CUDA runtime, architectures)."""
        return bytes(self._lib.trak_proj_build_info()).decode()

    def _check(self, status: int, what: str) -> None:
        if status != 0:
            message = bytes(self._lib.trak_proj_last_error()).decode()
            raise CudaExtUnavailableError(f"{what} failed (status {status}): {message}")

    def workspace_bytes(self, batch: int, n: int, p: int) -> int:
        """Workspace that runs every K-split of an ``n``-row block at once (0: none needed)."""
        return int(self._lib.trak_proj_workspace_bytes(batch, n, p))

    def rademacher(
        self,
        g: torch.Tensor,
        row_offset: int,
        out: torch.Tensor,
        seed: int,
        model_id: int,
        f32_terms: int,
        workspace: torch.Tensor | None,
        stream: int,
    ) -> None:
        """Queue ``out[:, :p] += g · P[row_offset : row_offset + n, :p]`` on ``stream``.

        ``g``: ``[B, n]`` float32/16 or bfloat16 on the current device, ``out``: ``[B, p]``
        float32 (both ``stride(1) == 1``); ``workspace``: float32 scratch of ≥ ``B·p`` entries
        when the block needs one; ``f32_terms``: bf16 terms of an fp32 ``g`` (2 or 3)."""
        batch, n = g.shape
        ld_g = g.stride(0) if batch > 1 else n
        ws_ptr = workspace.data_ptr() if workspace is not None else None
        ws_bytes = workspace.numel() * 4 if workspace is not None else 0
        status = self._lib.trak_proj_rademacher(
            g.data_ptr(),
            DTYPE_CODES[g.dtype],
            batch,
            n,
            ld_g,
            row_offset,
            out.data_ptr(),
            out.shape[1],
            out.stride(0),
            seed,
            model_id,
            f32_terms,
            ws_ptr,
            ws_bytes,
            stream,
        )
        self._check(status, "trak_proj_rademacher")

    def signs_host(
        self, seed: int, model_id: int, row0: int, nrows: int, col0: int, ncols: int
    ) -> torch.Tensor:
        """``P[row0 : row0 + nrows, col0 : col0 + ncols]`` as int8 ±1, from the compiled hash."""
        out = torch.empty(nrows, ncols, dtype=torch.int8)
        status = self._lib.trak_proj_rademacher_signs_host(
            seed, model_id, row0, nrows, col0, ncols, out.data_ptr()
        )
        self._check(status, "trak_proj_rademacher_signs_host")
        return out

    def p_tile_host(
        self, seed: int, model_id: int, row0: int, col_block: int, half: bool
    ) -> torch.Tensor:
        """The kernel's shared-memory P tile ``[32, 128]`` as raw fp16 / bf16 bits (int16)."""
        out = torch.empty(32, 128, dtype=torch.int16)
        status = self._lib.trak_proj_p_tile_host(
            seed, model_id, row0, col_block, int(half), out.data_ptr()
        )
        self._check(status, "trak_proj_p_tile_host")
        return out

    def split_f32_host(self, x: torch.Tensor, terms: int) -> torch.Tensor:
        """The kernel's split of fp32 ``x`` into ``[terms, numel]`` bf16 bit patterns (int16)."""
        flat = x.detach().to(torch.float32).contiguous().reshape(-1)
        out = torch.empty(terms, flat.numel(), dtype=torch.int16)
        status = self._lib.trak_proj_split_f32_host(
            flat.data_ptr(), flat.numel(), terms, out.data_ptr()
        )
        self._check(status, "trak_proj_split_f32_host")
        return out


_LOCK = threading.Lock()
_LIBRARIES: dict[Path, CudaLibrary] = {}
_CHECKED: set[tuple[Path, int, int]] = set()


def library_path() -> Path:
    """Where the library is looked for: ``$TRAK_DIST_CUDA_LIB`` if set, else the build directory
    of the kernel sources this trak_dist ships with (``trak_dist/cuda_ext/build`` when installed,
    ``cuda_ext/build`` in a checkout)."""
    env = os.environ.get(ENV_VAR)
    return Path(env) if env else DEFAULT_LIB


def load_library() -> CudaLibrary:
    """Load (once per path) the library of :func:`library_path`; an explicit
    ``$TRAK_DIST_CUDA_LIB`` is never replaced by the default build (CudaExtUnavailableError)."""
    path = library_path()
    with _LOCK:
        if path not in _LIBRARIES:
            if not path.is_file():
                searched = (
                    f"${ENV_VAR}={path}"
                    if os.environ.get(ENV_VAR)
                    else f"{path} (${ENV_VAR} is unset)"
                )
                raise CudaExtUnavailableError(
                    f"libtrak_proj.so not found; searched {searched}. Build it with "
                    f"{BUILD_HINT} or point ${ENV_VAR} at a built copy."
                )
            _LIBRARIES[path] = CudaLibrary(path)
        return _LIBRARIES[path]
