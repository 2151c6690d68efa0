"""The CUDA projection kernel (``cuda_ext/``) and its projector.

Without a GPU: the library builds for sm_80/sm_90 + PTX and exports its ABI, the hash and the
tile expansion compiled from the CUDA sources match the reference bit for bit, and
``make_projector`` falls back to the torch projector with one warning.
With a GPU (``make cuda && pytest -m gpu``): the kernel against the reference.
"""

from __future__ import annotations

import logging
import shutil
import struct
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from tests.fixtures.helpers import rademacher_entry
from trak_dist.errors import ConfigError, CudaExtUnavailableError
from trak_dist.projection import TorchProjector, _cuda, make_projector, rademacher_block
from trak_dist.projection._cuda import ENV_VAR, CudaLibrary, CudaProjector, load_library

ROOT = Path(__file__).resolve().parents[2]
NVCC = shutil.which("nvcc") or (
    "/usr/local/cuda/bin/nvcc" if Path("/usr/local/cuda/bin/nvcc").exists() else None
)
EXPORTS = (
    "trak_proj_abi_version",
    "trak_proj_build_info",
    "trak_proj_last_error",
    "trak_proj_workspace_bytes",
    "trak_proj_rademacher",
    "trak_proj_rademacher_signs_host",
    "trak_proj_p_tile_host",
    "trak_proj_split_f32_host",
)
GPU = pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="needs a CUDA GPU: run `pytest -m gpu` on a GPU machine after `make cuda`",
)


@pytest.fixture(scope="session")
def built_lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh build of ``cuda_ext`` from the current sources (never a stale cuda_ext/build)."""
    if NVCC is None:
        pytest.skip("nvcc not found")
    build_dir = tmp_path_factory.mktemp("cuda_build")
    proc = subprocess.run(
        ["make", "-C", str(ROOT / "cuda_ext"), f"BUILD_DIR={build_dir}", f"NVCC={NVCC}"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, f"make -C cuda_ext failed:\n{proc.stdout}\n{proc.stderr}"
    return build_dir / "libtrak_proj.so"


@pytest.fixture(scope="session")
def lib(built_lib: Path) -> CudaLibrary:
    return CudaLibrary(built_lib)


# ---- build -------------------------------------------------------------------------------------


def _fatbin_entries(data: bytes) -> set[tuple[str, int]]:
    """(kind, arch) of every image in the ELF's fat binaries, read from the fatbin container.

    Used when cuobjdump is absent: a container starts with magic 0xBA55ED50, a u16 version, a
    u16 header size and a u64 payload size; each entry starts with a u16 kind (1 PTX, 2 ELF), a
    u32 header size at byte 4, a u64 payload size at byte 8 and the u32 SM number at byte 28.
    """
    found: set[tuple[str, int]] = set()
    start = data.find(struct.pack("<I", 0xBA55ED50))
    while start != -1:
        _, header, size = struct.unpack_from("<HHQ", data, start + 4)
        pos, end = start + header, start + header + size
        while pos < end:
            kind, _, entry_header, payload = struct.unpack_from("<HHIQ", data, pos)
            (arch,) = struct.unpack_from("<I", data, pos + 28)
            found.add(({1: "ptx", 2: "elf"}.get(kind, str(kind)), arch))
            pos += entry_header + payload
        start = data.find(struct.pack("<I", 0xBA55ED50), start + 4)
    return found


@pytest.mark.slow
def test_build_exports_abi_and_architectures(built_lib: Path) -> None:
    assert built_lib.is_file()
    nm = subprocess.run(
        ["nm", "-D", "--defined-only", str(built_lib)], capture_output=True, text=True, check=True
    )
    exported = {line.split()[-1] for line in nm.stdout.splitlines() if line.strip()}
    assert set(EXPORTS) <= exported
    # Only the ABI is exported: the static CUDA runtime stays private to the library.
    assert {s for s in exported if not s.startswith("trak_proj_")} == set()
    needed = subprocess.run(
        ["readelf", "-d", str(built_lib)], capture_output=True, text=True, check=True
    ).stdout
    assert "libcudart" not in needed and "libcuda.so" not in needed

    cuobjdump = shutil.which("cuobjdump")
    if cuobjdump:
        elf = subprocess.run(
            [cuobjdump, "--list-elf", str(built_lib)], capture_output=True, text=True, check=True
        ).stdout
        ptx = subprocess.run(
            [cuobjdump, "--list-ptx", str(built_lib)], capture_output=True, text=True, check=True
        ).stdout
        assert "sm_80" in elf and "sm_90" in elf
        assert "sm_90" in ptx or "compute_90" in ptx
    else:
        entries = _fatbin_entries(built_lib.read_bytes())
        assert {("elf", 80), ("elf", 90), ("ptx", 90)} <= entries


def test_library_loads_without_gpu(lib: CudaLibrary) -> None:
    assert lib.build_info().endswith("archs sm_80 sm_90 compute_90")
    assert "abi 1" in lib.build_info()


# ---- the compiled hash against the reference, bit for bit --------------------------------------


SIGN_CASES = [
    # seed, model_id, row0, nrows, col0, ncols
    (0, 0, 0, 40, 0, 300),
    (2**32 + 7, 5, 2**32 - 20, 40, 77, 200),  # rows cross 2**32, columns start mid-block
    (12345, 2**32 - 1, 2**40 + 3, 17, 1000, 129),
    (2**63 + 2**31, 1, 2**62 - 9, 9, 2**32 - 300, 300),  # last columns of the hash
]


@pytest.mark.parametrize(("seed", "model_id", "row0", "nrows", "col0", "ncols"), SIGN_CASES)
def test_host_signs_match_reference(
    lib: CudaLibrary, seed: int, model_id: int, row0: int, nrows: int, col0: int, ncols: int
) -> None:
    got = lib.signs_host(seed, model_id, row0, nrows, col0, ncols)
    ref = rademacher_block(seed, model_id, row0, row0 + nrows, col0, col0 + ncols, torch.int8)
    assert torch.equal(got, ref)


def test_host_signs_at_the_top_of_the_row_range(lib: CudaLibrary) -> None:
    # Rows ≥ 2**63 do not fit torch's int64 reference; check against Python integers.
    seed, model_id, row0, col0 = 2**64 - 1, 7, 2**64 - 6, 2**32 - 130
    got = lib.signs_host(seed, model_id, row0, 6, col0, 130)
    ref = [
        [rademacher_entry(seed, model_id, row0 + r, col0 + c) for c in range(130)] for r in range(6)
    ]
    assert got.tolist() == ref


@pytest.mark.parametrize("half", [False, True])
@pytest.mark.parametrize(
    ("seed", "model_id", "row0", "col_block"), [(0, 0, 0, 0), (2**40 + 1, 9, 2**32 - 16, 3)]
)
def test_host_p_tile_is_the_reference_block(
    lib: CudaLibrary, half: bool, seed: int, model_id: int, row0: int, col_block: int
) -> None:
    bits = lib.p_tile_host(seed, model_id, row0, col_block, half)
    one = 0x3C00 if half else 0x3F80
    assert set(torch.unique(bits.to(torch.int32) & 0xFFFF).tolist()) <= {one, one | 0x8000}
    values = bits.view(torch.float16 if half else torch.bfloat16).to(torch.float32)
    ref = rademacher_block(seed, model_id, row0, row0 + 32, 128 * col_block, 128 * col_block + 128)
    assert torch.equal(values, ref)


def test_host_split_f32(lib: CudaLibrary) -> None:
    gen = torch.Generator().manual_seed(0)
    scales = torch.tensor([1e-30, 1e-8, 1e-3, 1.0, 1e3, 1e20], dtype=torch.float64)
    x = (torch.randn(6, 2000, generator=gen, dtype=torch.float64) * scales[:, None]).float()
    x = torch.cat([x.reshape(-1), torch.tensor([0.0, -0.0, 1.0, -3.0, 65504.0, 1e-38])])
    x64 = x.double()
    one = lib.split_f32_host(x, 1).view(torch.bfloat16)
    assert torch.equal(one[0].view(torch.int16), x.to(torch.bfloat16).view(torch.int16))
    for terms, bound in ((2, 2.0**-16), (3, 2.0**-24)):
        parts = lib.split_f32_host(x, terms).view(torch.bfloat16).double()
        assert torch.equal(parts[0], one[0].double())
        err = (x64 - parts.sum(dim=0)).abs()
        # + half the spacing of bf16's subnormals, which the last terms of tiny x can reach
        assert bool((err <= bound * x64.abs() + 2.0**-134).all()), terms
    # Three terms hold every fp32 exactly unless the last one falls below bf16's normal range.
    normal = x64.abs() >= 2.0**-100
    exact = lib.split_f32_host(x, 3).view(torch.bfloat16).double().sum(dim=0)
    assert torch.equal(exact[normal], x64[normal])


def test_workspace_plan_depends_on_n_alone(lib: CudaLibrary) -> None:
    assert lib.workspace_bytes(7, 8192, 513) == 0
    splits = {}
    for n in (8193, 100_000, 10**8, 2**31 + 4097):
        per_shape = {
            lib.workspace_bytes(b, n, p) // (b * p * 4) for b in (1, 33, 512) for p in (1, 2048)
        }
        assert len(per_shape) == 1
        splits[n] = per_shape.pop()
    assert splits[8193] == 2 and splits[10**8] == -(-(10**8) // 65536)
    assert splits[2**31 + 4097] < 65535


# ---- fallback ----------------------------------------------------------------------------------


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the fallback where no GPU exists")
def test_make_projector_falls_back_with_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="trak_dist"):
        proj = make_projector("rademacher", 1000, 64, seed=3, device="cuda")
    assert isinstance(proj, TorchProjector)
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1
    message = warnings[0].getMessage()
    assert "CUDA projection kernel unavailable" in message
    assert "CPU-only build" in message or "no CUDA GPU" in message


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error where no GPU exists")
def test_backend_cuda_raises_without_gpu() -> None:
    with pytest.raises(CudaExtUnavailableError, match=r"CPU-only build|no CUDA GPU"):
        make_projector("rademacher", 1000, 64, device="cuda", backend="cuda")
    with pytest.raises(CudaExtUnavailableError, match="not a CUDA device"):
        make_projector("rademacher", 1000, 64, device="cpu", backend="cuda")


@pytest.fixture
def pretend_gpu(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Let the projector get past the device checks, to exercise the library lookup."""
    monkeypatch.setattr(_cuda, "cuda_device", lambda device: torch.device("cuda", 0))
    yield


def test_missing_library_names_the_path_and_the_fix(
    pretend_gpu: None,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    missing = tmp_path / "nowhere" / "libtrak_proj.so"
    monkeypatch.setenv(ENV_VAR, str(missing))
    with pytest.raises(CudaExtUnavailableError) as info:
        make_projector("rademacher", 1000, 64, device="cuda", backend="cuda")
    assert str(missing) in str(info.value) and "make cuda" in str(info.value)
    with caplog.at_level(logging.WARNING, logger="trak_dist"):
        proj = make_projector("rademacher", 1000, 64, device="cuda")
    assert isinstance(proj, TorchProjector)
    assert len(caplog.records) == 1 and str(missing) in caplog.records[0].getMessage()


def test_unloadable_library_is_reported(
    pretend_gpu: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    bogus = tmp_path / "libtrak_proj.so"
    bogus.write_bytes(b"not an ELF file")
    monkeypatch.setenv(ENV_VAR, str(bogus))
    with pytest.raises(CudaExtUnavailableError, match=r"could not load .*make cuda"):
        load_library()


def test_default_library_path_is_the_build_dir(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_VAR, raising=False)
    assert _cuda.library_path() == ROOT / "cuda_ext" / "build" / "libtrak_proj.so"


def test_bad_f32_terms_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="f32_terms=4"):
        CudaProjector(100, 8, f32_terms=4)


# ---- on a GPU ----------------------------------------------------------------------------------

SEED, MODEL_ID = 2**32 + 99, 4
D = 20_011  # three K-splits of 8192 rows, not a multiple of anything the kernel tiles by
# Relative to each row's L2 norm. bf16/fp16 inputs are exact products, so only the fp32
# accumulation errs (chains of ≤ 1024 rows on truncating tensor cores, then round-to-nearest
# adds): ~2^-20 expected. fp32 split into two bf16 terms loses ≤ 2^-16 per entry, ~2^-16·|g|₂
# per output, whose max over 2048 columns stays below 2^-12; three terms are fp32-exact. A
# single wrong sign costs 2|g_k| ≈ 2^-6·|g|₂ here, far above every tolerance.
REL_TOL = {"f32x2": 2.0**-12, "f32x3": 2.0**-16, "bf16": 2.0**-16, "f16": 2.0**-16}
DTYPES = {
    "f32x2": torch.float32,
    "f32x3": torch.float32,
    "bf16": torch.bfloat16,
    "f16": torch.float16,
}


def _reference(blocks: dict[int, torch.Tensor], p: int, seed: int = SEED) -> torch.Tensor:
    """``Σ_blocks g · P[offset : offset + n, :p]`` in fp64, P generated in row chunks."""
    out: torch.Tensor | None = None
    for offset, g in blocks.items():
        g64 = g.double()
        for r0 in range(0, g.shape[1], 8192):
            r1 = min(g.shape[1], r0 + 8192)
            block = rademacher_block(
                seed, MODEL_ID, offset + r0, offset + r1, 0, p, torch.float64, g.device
            )
            part = g64[:, r0:r1] @ block
            out = part if out is None else out + part
    assert out is not None
    return out


def _assert_rows_close(
    got: torch.Tensor, ref: torch.Tensor, blocks: dict[int, torch.Tensor], rel: float
) -> None:
    norms = torch.sqrt(sum((g.double() ** 2).sum(dim=1) for g in blocks.values()))
    err = (got.double() - ref).abs().amax(dim=1)
    worst = float((err / norms).max())
    assert bool((err <= rel * norms).all()), f"max error {worst:.3g}·|g|₂ > {rel:.3g}·|g|₂"


def _grads(batch: int, d: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(batch, d, generator=gen, device="cuda").to(dtype)


def _project(
    blocks: dict[int, torch.Tensor], d: int, p: int, mode: str, **kwargs: int
) -> torch.Tensor:
    terms = 3 if mode == "f32x3" else 2
    proj = CudaProjector(d, p, SEED, device="cuda", f32_terms=terms, **kwargs)
    return proj.project([(o, g) for o, g in blocks.items()], MODEL_ID)


@pytest.mark.gpu
@GPU
@pytest.mark.parametrize("mode", list(REL_TOL))
@pytest.mark.parametrize("p", [1, 513, 2048])
@pytest.mark.parametrize("batch", [1, 7, 33, 130])
def test_kernel_matches_reference(mode: str, p: int, batch: int) -> None:
    g = _grads(batch, D, DTYPES[mode])
    # three blocks: a tiny one, a 16-byte aligned one, one whose rows are not 16-byte aligned
    blocks = {
        0: g[:, :5].contiguous(),
        5: g[:, 5:9005].contiguous(),
        9005: g[:, 9005:].contiguous(),
    }
    got = _project(blocks, D, p, mode)
    assert got.shape == (batch, p) and got.dtype == torch.float32 and got.is_cuda
    _assert_rows_close(got, _reference(blocks, p), blocks, REL_TOL[mode])


@pytest.mark.gpu
@GPU
@pytest.mark.parametrize("mode", ["f32x2", "bf16"])
def test_prefix_and_batch_invariance_are_exact(mode: str) -> None:
    g = _grads(33, D, DTYPES[mode], seed=1)
    full = _project({0: g}, D, 2048, mode)
    assert torch.equal(_project({0: g}, D, 513, mode), full[:, :513])
    assert torch.equal(_project({0: g}, D, 1, mode), full[:, :1])
    assert torch.equal(_project({0: g[3:10]}, D, 2048, mode), full[3:10])
    assert torch.equal(_project({0: g[:1]}, D, 2048, mode), full[:1])


@pytest.mark.gpu
@GPU
def test_deterministic_whatever_the_workspace() -> None:
    d, p = 100_000, 300  # 13 K-splits
    g = _grads(9, d, torch.float32, seed=2)
    a = _project({0: g}, d, p, "f32x2")
    assert torch.equal(_project({0: g}, d, p, "f32x2"), a)
    assert torch.equal(_project({0: g}, d, p, "f32x2", workspace_bytes=1), a)  # one split a launch
    _assert_rows_close(a, _reference({0: g}, p), {0: g}, REL_TOL["f32x2"])


@pytest.mark.gpu
@GPU
def test_row_offsets_beyond_2_32() -> None:
    g = _grads(5, 12_000, torch.float32, seed=3)
    blocks = {2**32 + 12_345: g[:, :3000].contiguous(), 2**40 - 7: g[:, 3000:].contiguous()}
    got = _project(blocks, 2**41, 700, "f32x2")
    _assert_rows_close(got, _reference(blocks, 700), blocks, REL_TOL["f32x2"])


@pytest.mark.gpu
@GPU
def test_strided_and_cpu_inputs() -> None:
    g = _grads(6, 3001, torch.float32, seed=4)
    strided = g.t().contiguous().t()  # same values, stride(1) == 6
    proj = CudaProjector(3001, 257, SEED)
    a = proj.project(g, MODEL_ID)
    assert torch.equal(proj.project(strided, MODEL_ID), a)
    on_cpu = proj.project(g.cpu(), MODEL_ID)
    assert on_cpu.device.type == "cpu" and torch.equal(on_cpu, a.cpu())
    assert proj.project(g[:0], MODEL_ID).shape == (0, 257)


@pytest.mark.gpu
@GPU
def test_make_projector_picks_the_kernel_on_a_gpu() -> None:
    assert isinstance(make_projector("rademacher", 1000, 64, device="cuda"), CudaProjector)
    assert isinstance(make_projector("normal", 1000, 64, device="cuda"), TorchProjector)


@pytest.mark.gpu
@pytest.mark.slow
@GPU
def test_batch_times_d_beyond_2_32_elements() -> None:
    d, p, w = 2**31 + 4097, 136, 1000
    need = 2 * d * 2 + 2**30
    if torch.cuda.get_device_properties(0).total_memory < need:
        pytest.skip(f"needs {need / 2**30:.1f} GiB of GPU memory")
    g = torch.zeros(2, d, dtype=torch.bfloat16, device="cuda")
    gen = torch.Generator(device="cuda").manual_seed(5)
    # Non-zero windows at the start, around row 2**31 and at the end of each row: the end of row 1
    # sits past element 2**32 of G, where 32-bit indexing would wrap.
    starts = (0, 2**31 - w // 2, d - w)
    for s in starts:
        g[:, s : s + w] = torch.randn(2, w, generator=gen, device="cuda").to(torch.bfloat16)
    got = CudaProjector(d, p, SEED).project(g, MODEL_ID)
    windows = {s: g[:, s : s + w] for s in starts}
    _assert_rows_close(got, _reference(windows, p), windows, REL_TOL["bf16"])
    del g
    torch.cuda.empty_cache()
