"""Section ``kernel``: the CUDA kernel against the torch reference on the same seeds.

- Signs, bit for bit: the identity block ``I_n`` at row offset o projects to ``P[o : o + n]``
  exactly (each output is one ±1 times 1.0), in fp32, fp16 and bf16, at offsets across 2³²
  and 2⁴⁰, compared with ``rademacher_block`` on the GPU and on the CPU.
- Products, at a stated tolerance: odd shapes (B, d, p) split into three blocks (a tiny one, an
  aligned one, one whose rows are not 16-byte aligned) in fp32 (2 and 3 bf16 terms), fp16 and
  bf16, against an fp64 product with the same P; the torch projector on the same device too
  (at 2⁻¹² for every dtype: it accumulates in plain fp32).
  Tolerances, relative to each row's L2 norm (cuda_ext/README.md): fp32 in 2 terms 2⁻¹², in 3
  terms and fp16/bf16 2⁻¹⁶ (only fp32 accumulation errs); one wrong sign costs about 2·|g_k|.
- Determinism: the same call twice gives the same bits.

In the dry run the kernel cannot run: the compiled hash (the library's host functions) is
checked bit for bit instead, and the products with the torch projector alone."""

from __future__ import annotations

import sys
from collections.abc import Callable

import torch

from benchmarks.device._section import Section
from trak_dist.projection import GradBlock, TorchProjector, rademacher_block
from trak_dist.projection._cuda import CudaProjector, load_library

SEED, MODEL_ID = 2**32 + 99, 4
SIGN_CASES = ((0, 257, 130), (2**32 - 100, 200, 4097), (2**40 + 3, 129, 1))  # offset, n, p
SHAPES = ((1, 1, 1), (7, 20_011, 513), (33, 65_537, 130), (130, 8191, 2048), (257, 100_003, 17))
DRY_SHAPES = ((1, 1, 1), (7, 2011, 33), (33, 655, 130))
MODES = {
    "fp32 (2 terms)": (torch.float32, 2, 2.0**-12),
    "fp32 (3 terms)": (torch.float32, 3, 2.0**-16),
    "fp16": (torch.float16, 2, 2.0**-16),
    "bf16": (torch.bfloat16, 2, 2.0**-16),
}
# the torch projector accumulates in plain fp32 over all d rows: ~√d·2⁻²⁴ relative, 2⁻¹⁶ at d = 10⁵
TORCH_TOL = 2.0**-12
Project = Callable[[list[GradBlock], int, int, int], torch.Tensor]  # blocks, d, p, terms


def _kernel(blocks: list[GradBlock], d: int, p: int, terms: int) -> torch.Tensor:
    return CudaProjector(d, p, SEED, device="cuda", f32_terms=terms).project(blocks, MODEL_ID)


def _torch(device: str) -> Project:
    def project(blocks: list[GradBlock], d: int, p: int, terms: int) -> torch.Tensor:
        return TorchProjector(d, p, SEED, device=device).project(blocks, MODEL_ID)

    return project


def signs(s: Section) -> bool:
    ok = True
    rows = []
    lib = load_library()
    for offset, n, p in SIGN_CASES:
        ref_cpu = rademacher_block(SEED, MODEL_ID, offset, offset + n, 0, p, torch.float32)
        host = lib.signs_host(SEED, MODEL_ID, offset, n, 0, p).to(torch.float32)
        row = [offset, n, p, "yes" if torch.equal(host, ref_cpu) else "**NO**"]
        ok &= torch.equal(host, ref_cpu)
        if s.gpu:
            ref = rademacher_block(SEED, MODEL_ID, offset, offset + n, 0, p, torch.float32, "cuda")
            same_ref = torch.equal(ref.cpu(), ref_cpu)
            ok &= same_ref
            row.append("yes" if same_ref else "**NO**")
            for dtype in (torch.float32, torch.float16, torch.bfloat16):
                eye = torch.eye(n, dtype=dtype, device="cuda")
                y = _kernel([GradBlock(offset, eye)], offset + n, p, 2)
                equal = torch.equal(y, ref)
                ok &= equal
                row.append("yes" if equal else f"**NO** ({int((y != ref).sum())} differ)")
        rows.append(row)
    heads = ["row offset", "rows", "p", "compiled hash = CPU reference"]
    if s.gpu:
        heads += ["GPU reference = CPU", "kernel fp32", "kernel fp16", "kernel bf16"]
    s.write("Signs, bit for bit (kernel: the identity block projected)")
    s.table(heads, rows)
    if not s.gpu:
        s.skip("the kernel's signs on a GPU", "needs a CUDA GPU")
    return ok


def _reference(blocks: list[GradBlock], p: int, device: str) -> torch.Tensor:
    """Σ_blocks g · P[offset : offset + n, :p] in fp64, P generated in row chunks."""
    out = torch.zeros(blocks[0].grad.shape[0], p, dtype=torch.float64, device=device)
    for offset, g in blocks:
        for r0 in range(0, g.shape[1], 8192):
            r1 = min(g.shape[1], r0 + 8192)
            block = rademacher_block(
                SEED, MODEL_ID, offset + r0, offset + r1, 0, p, torch.float64, device
            )
            out += g[:, r0:r1].double() @ block
    return out


def _blocks(g: torch.Tensor) -> list[GradBlock]:
    d = g.shape[1]
    if d < 10:
        return [GradBlock(0, g)]
    cut = 5 + (d - 5) // 2
    return [
        GradBlock(0, g[:, :5].contiguous()),
        GradBlock(5, g[:, 5:cut].contiguous()),
        GradBlock(cut, g[:, cut:].contiguous()),
    ]


def products(s: Section, name: str, project: Project, tol_all: float | None = None) -> bool:
    """``project`` on every shape and mode against fp64; the worst error per row's |g|₂
    (``tol_all``: one tolerance for every mode instead of the kernel's)."""
    ok = True
    s.write()
    s.write(f"Products: {name} against fp64 (error / row's L2 norm ≤ tolerance)")
    s.table(["B", "d", "p", *MODES], [])
    for batch, d, p in SHAPES if s.gpu else DRY_SHAPES:
        if s.out_of_time(f"products at B={batch} d={d} p={p}", 3):
            return False
        gen = torch.Generator(device=s.device).manual_seed(d)
        base = torch.randn(batch, d, generator=gen, device=s.device)
        cells = []
        for dtype, terms, kernel_tol in MODES.values():
            tol = tol_all or kernel_tol
            blocks = _blocks(base.to(dtype))
            got = project(blocks, d, p, terms)
            norms = torch.sqrt(sum((b.grad.double() ** 2).sum(dim=1) for b in blocks))
            err = (got.double() - _reference(blocks, p, s.device)).abs().amax(dim=1) / norms
            worst = float(err.max())
            fine = worst <= tol
            ok &= fine
            cells.append(f"{worst:.2g} ≤ {tol:.2g}" if fine else f"**{worst:.2g} > {tol:.2g}**")
        s.row([batch, d, p, *cells])
    return ok


def determinism(s: Section) -> bool:
    g = torch.randn(33, 100_000, generator=torch.Generator("cuda").manual_seed(2), device="cuda")
    a = _kernel([GradBlock(0, g)], 100_000, 300, 2)
    b = _kernel([GradBlock(0, g)], 100_000, 300, 2)
    same = torch.equal(a, b)
    s.write(
        f"- determinism: the same call twice gives the same bits: {'yes' if same else '**NO**'}"
    )
    return same


def main() -> int:
    s = Section()
    ok = signs(s)
    if s.gpu:
        ok &= products(s, "the kernel", _kernel)
        ok &= products(s, "the torch projector on the GPU", _torch("cuda"), TORCH_TOL)
        ok &= determinism(s)
        s.record("all_match", int(ok))
    else:
        s.skip("the kernel's products", "needs a CUDA GPU (the same code runs the torch projector)")
        ok &= products(s, "the torch projector on the CPU", _torch("cpu"), TORCH_TOL)
    if not ok:
        s.fail("a comparison above did not hold")
    return s.done()


if __name__ == "__main__":
    sys.exit(main())
