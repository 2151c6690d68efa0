"""The CUDA projector: ``cuda_ext``'s Rademacher kernel via ctypes, queued on torch's current
stream of the gradients' device (ordered with torch work, no syncs)."""

from __future__ import annotations

import torch

from trak_dist.errors import ConfigError, CudaExtUnavailableError
from trak_dist.projection._base import (
    GradBlock,
    GradInput,
    ProjectionKind,
    Projector,
    as_blocks,
    check_model_id,
)
from trak_dist.projection._cuda_lib import (
    _CHECKED,
    ABI_VERSION,
    DEFAULT_LIB,
    DTYPE_CODES,
    ENV_VAR,
    MIN_CAPABILITY,
    CudaLibrary,
    library_path,
    load_library,
)
from trak_dist.projection._generate import rademacher_block

__all__ = [
    "ABI_VERSION",
    "DEFAULT_LIB",
    "ENV_VAR",
    "CudaLibrary",
    "CudaProjector",
    "cuda_device",
    "library_path",
    "load_library",
]


def cuda_device(device: torch.device | str) -> torch.device:
    """The CUDA device the kernel would run on, index resolved (CudaExtUnavailableError: no
    CUDA torch, no visible GPU, or one too old)."""
    device = torch.device(device)
    if device.type != "cuda":
        raise CudaExtUnavailableError(
            f"device={device} is not a CUDA device; the CUDA projector runs on GPUs only."
        )
    if torch.version.cuda is None:
        raise CudaExtUnavailableError(
            f"torch {torch.__version__} is a CPU-only build; install a CUDA build of torch to "
            "use the CUDA projection kernel."
        )
    if not torch.cuda.is_available():
        raise CudaExtUnavailableError(
            "torch sees no CUDA GPU (torch.cuda.is_available() is False); check the NVIDIA "
            "driver and CUDA_VISIBLE_DEVICES."
        )
    index = torch.cuda.current_device() if device.index is None else device.index
    if index >= torch.cuda.device_count():
        raise CudaExtUnavailableError(
            f"device={device}, but only {torch.cuda.device_count()} CUDA devices are visible."
        )
    capability = torch.cuda.get_device_capability(index)
    if capability < MIN_CAPABILITY:
        raise CudaExtUnavailableError(
            f"{torch.cuda.get_device_name(index)} has compute capability {capability}; the "
            f"kernel needs {MIN_CAPABILITY} or newer (bf16 tensor cores)."
        )
    return torch.device("cuda", index)


class CudaProjector(Projector):
    """Rademacher projection by the ``cuda_ext`` kernel, bit for bit the reference matrix.

    P is generated on the fly; each gradient block is one kernel call at its global row offset.

    Args:
        device: the GPU used when gradients arrive on the CPU.
        f32_terms: bf16 terms an fp32 gradient is split into: 2 (relative error ≤ 2⁻¹⁶ per
            entry) or 3 (≤ 2⁻²⁴, fp32's own rounding; slower).
        workspace_bytes: cap on the split-K scratch (the result is the same bit for bit).
        self_check: compare a small projection with the CPU reference once per GPU.

    Raises:
        CudaExtUnavailableError: no usable GPU or library (the message says why and what to do).
    """

    kind = ProjectionKind.RADEMACHER

    def __init__(
        self,
        grad_dim: int,
        proj_dim: int,
        seed: int = 0,
        device: torch.device | str = "cuda",
        *,
        f32_terms: int = 2,
        workspace_bytes: int = 128 * 2**20,
        self_check: bool = True,
    ) -> None:
        super().__init__(grad_dim, proj_dim, seed)
        if f32_terms not in (2, 3):
            raise ConfigError(f"f32_terms={f32_terms}; expected 2 or 3.")
        if proj_dim > 2**32:
            raise ConfigError(f"proj_dim={proj_dim} exceeds the hash's 2**32 columns.")
        self.device = cuda_device(device)
        self.f32_terms = f32_terms
        self.workspace_bytes = int(workspace_bytes)
        self._lib = load_library()
        if self_check:
            _self_check(self._lib, self.device, f32_terms)

    def project(self, grads: GradInput, model_id: int) -> torch.Tensor:
        model_id = check_model_id(model_id)
        blocks = as_blocks(grads)
        self._check_blocks(blocks)
        source = blocks[0].grad.device
        batch = blocks[0].grad.shape[0]
        for b in blocks:
            if b.grad.shape[0] != batch or b.grad.device != source:
                raise ConfigError(
                    f"gradient blocks disagree: batch {b.grad.shape[0]} on {b.grad.device} vs "
                    f"batch {batch} on {source}. Pass blocks of one batch on one device."
                )
        device = source if source.type == "cuda" else self.device
        out = torch.zeros(batch, self.proj_dim, dtype=torch.float32, device=device)
        if batch > 0:
            with torch.cuda.device(device):
                self._run(blocks, out, model_id)
        return out if device == source else out.to(source)

    def _run(self, blocks: list[GradBlock], out: torch.Tensor, model_id: int) -> None:
        batch, p = out.shape
        per_split = batch * p * 4
        needed = max(self._lib.workspace_bytes(batch, b.grad.shape[1], p) for b in blocks)
        workspace = None
        if needed:
            size = min(needed, max(per_split, self.workspace_bytes))
            workspace = torch.empty(-(-size // 4), dtype=torch.float32, device=out.device)
        stream = torch.cuda.current_stream(out.device).cuda_stream
        for offset, g in blocks:
            if g.shape[1] == 0:
                continue
            self._lib.rademacher(
                _kernel_input(g, out.device),
                offset,
                out,
                self.seed,
                model_id,
                self.f32_terms,
                workspace,
                stream,
            )


def _kernel_input(g: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``g`` on ``device`` in a dtype the kernel reads, copied only when it must be."""
    g = g.detach()
    if g.dtype not in DTYPE_CODES:
        if not g.is_floating_point():
            raise ConfigError(f"gradients have dtype {g.dtype}; expected a floating dtype.")
        g = g.to(torch.float32)
    g = g.to(device)
    if g.shape[1] > 1 and g.stride(1) != 1:
        g = g.contiguous()
    return g


def _self_check(lib: CudaLibrary, device: torch.device, f32_terms: int) -> None:
    """Project a small fp32 batch (two blocks, one beyond row 2³²) and compare with fp64, so a
    library that cannot run here or computes wrong numbers makes ``make_projector`` fall back."""
    key = (lib.path, device.index or 0, f32_terms)
    if key in _CHECKED:
        return
    gen = torch.Generator().manual_seed(1234)
    grads = torch.randn(5, 370, generator=gen, dtype=torch.float64)
    offsets = ((0, 300), (2**32 + 5, 70))
    seed, model_id, p = 2**33 + 17, 3, 130
    ref = sum(
        grads[:, lo : lo + n] @ rademacher_block(seed, model_id, off, off + n, 0, p, torch.float64)
        for (off, n), lo in zip(offsets, (0, 300), strict=True)
    )
    try:
        with torch.cuda.device(device):
            out = torch.zeros(5, p, dtype=torch.float32, device=device)
            stream = torch.cuda.current_stream(device).cuda_stream
            g = grads.to(device=device, dtype=torch.float32)
            for (off, n), lo in zip(offsets, (0, 300), strict=True):
                lib.rademacher(g[:, lo : lo + n], off, out, seed, model_id, f32_terms, None, stream)
            got = out.double().cpu()
    except RuntimeError as e:  # a CUDA error surfacing at the copy
        raise CudaExtUnavailableError(f"the CUDA projection kernel failed on {device}: {e}") from e
    # fp32 inputs round to fp32 (2^-24) and split into bf16 terms (2^-16 with two); the
    # tolerance is 2^-12 of each row's L1 norm, far below one wrong sign (2·|g_k|).
    tol = 2.0**-12 * grads.abs().sum(dim=1, keepdim=True)
    err = (got - ref).abs()
    if not bool((err <= tol).all()):
        raise CudaExtUnavailableError(
            f"the CUDA projection kernel disagrees with the CPU reference on "
            f"{torch.cuda.get_device_name(device)} (max error {err.max().item():.3g}, tolerance "
            f"{tol.min().item():.3g}); library {lib.path} ({lib.build_info()}). Please report "
            "this; the torch projector gives the correct result meanwhile."
        )
    _CHECKED.add(key)
