"""Dense blocks of P from the hash (``docs/projection.md``): the CPU reference the CUDA kernel is
tested against and the torch projector multiplies with; ``_WORK_BYTES`` bounds memory."""

from __future__ import annotations

import math

import torch

from trak_dist.projection._philox import MASK32, philox4x32

NORMAL_KEY_TWEAK = 0x6E6F726D  # ASCII "norm"
_WORK_BYTES = 64 * 2**20
_BYTE_SHIFTS = (0, 8, 16, 24)
_TABLES: dict[tuple[torch.dtype, str], torch.Tensor] = {}


def _sign_table(dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """``[256, 8]``: row b holds the signs (+1 for a 0 bit) of b's bits, least significant first."""
    key = (dtype, str(device))
    if key not in _TABLES:
        byte = torch.arange(256, dtype=torch.int64)[:, None]
        bits = byte >> torch.arange(8, dtype=torch.int64) & 1
        _TABLES[key] = (1 - 2 * bits).to(dtype=dtype, device=device)
    return _TABLES[key]


def _row_words(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return rows & MASK32, (rows >> 32) & MASK32


def _key(seed: int) -> tuple[int, int]:
    return seed & MASK32, (seed >> 32) & MASK32


def rademacher_block(
    seed: int,
    model_id: int,
    row_start: int,
    row_end: int,
    col_start: int,
    col_end: int,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    key_tweak: int = 0,
) -> torch.Tensor:
    """``P[row_start:row_end, col_start:col_end]`` of the Rademacher projection, ±1 in ``dtype``;
    a non-zero ``key_tweak`` (XORed into the key's high word) gives an independent matrix from
    the same seed (the Kronecker factors, docs/projection.md)."""
    n_rows, n_cols = row_end - row_start, col_end - col_start
    out = torch.empty(n_rows, n_cols, dtype=dtype, device=device)
    if n_rows == 0 or n_cols == 0:
        return out
    first_block, last_block = col_start >> 7, (col_end - 1) >> 7
    jblocks = torch.arange(first_block, last_block + 1, dtype=torch.int64, device=device)
    span = jblocks.numel() * 128
    lo = col_start - first_block * 128
    k0, k1 = _key(seed)
    k1 ^= key_tweak
    table = _sign_table(dtype, device)
    shifts = torch.tensor(_BYTE_SHIFTS, dtype=torch.int64, device=device)
    mid = torch.tensor(model_id, dtype=torch.int64, device=device)
    step = max(1, _WORK_BYTES // (8 * span))
    for r0 in range(0, n_rows, step):
        r1 = min(n_rows, r0 + step)
        rows = torch.arange(row_start + r0, row_start + r1, dtype=torch.int64, device=device)
        ilo, ihi = _row_words(rows)
        words = philox4x32(ilo[:, None], ihi[:, None], jblocks[None, :], mid, k0, k1)
        # [R, W, 4] words → [R, W, 4, 4] bytes, least significant first; each byte → its 8 signs
        # through a 256-row table, so the flat position is the column index. The lookup is
        # ~10× faster on CPU than extracting the 32 bits one shift at a time.
        data = (torch.stack(words, dim=-1)[..., None] >> shifts) & 0xFF
        signs = table[data.reshape(r1 - r0, span // 8)].reshape(r1 - r0, span)
        out[r0:r1] = signs[:, lo : lo + n_cols]
    return out


def normal_block(
    seed: int,
    model_id: int,
    row_start: int,
    row_end: int,
    col_start: int,
    col_end: int,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
) -> torch.Tensor:
    """``P[row_start:row_end, col_start:col_end]`` of the normal (Box–Muller) projection."""
    n_rows, n_cols = row_end - row_start, col_end - col_start
    out = torch.empty(n_rows, n_cols, dtype=dtype, device=device)
    if n_rows == 0 or n_cols == 0:
        return out
    first_pair, last_pair = col_start >> 1, (col_end - 1) >> 1
    pairs = torch.arange(first_pair, last_pair + 1, dtype=torch.int64, device=device)
    span = pairs.numel() * 2
    lo = col_start - first_pair * 2
    k0, k1 = _key(seed)
    k1 ^= NORMAL_KEY_TWEAK
    mid = torch.tensor(model_id, dtype=torch.int64, device=device)
    step = max(1, _WORK_BYTES // (32 * span))
    for r0 in range(0, n_rows, step):
        r1 = min(n_rows, r0 + step)
        rows = torch.arange(row_start + r0, row_start + r1, dtype=torch.int64, device=device)
        ilo, ihi = _row_words(rows)
        x0, x1, _, _ = philox4x32(ilo[:, None], ihi[:, None], pairs[None, :], mid, k0, k1)
        u1 = (x0.to(torch.float64) + 0.5) * 2.0**-32
        u2 = (x1.to(torch.float64) + 0.5) * 2.0**-32
        radius = torch.sqrt(-2.0 * torch.log(u1))
        angle = 2.0 * math.pi * u2
        z = torch.stack((radius * torch.cos(angle), radius * torch.sin(angle)), dim=-1)
        out[r0:r1] = z.reshape(r1 - r0, span)[:, lo : lo + n_cols].to(dtype)
    return out


SAMPLING_KEY_TWEAK = 0x73616D70  # ASCII "samp"
DRAW_KEY_STEP = 0x9E3779B9  # the golden-ratio increment: draw d's key is k0 ^ (d · step)


def uniform_rows(
    seed: int,
    model_id: int,
    rows: torch.Tensor,
    width: int,
    device: torch.device | str = "cpu",
    draw: int = 0,
) -> torch.Tensor:
    """``[len(rows), width]`` float32 uniforms in (0, 1): entry (r, t) is the hash of (seed,
    model_id, row ``rows[r]``, position t) under its own key (one key per ``draw``; draw 0's is
    the seed's), so it depends on nothing else (not the batch, its order or its split). The
    noise that draws a row's labels from the model for the sampled-label Fisher
    (docs/design.md, "Curvature")."""
    rows = torch.as_tensor(rows, dtype=torch.int64, device=device).reshape(-1)
    cols = torch.arange(width, dtype=torch.int64, device=device)
    k0, k1 = _key(seed)
    k0 ^= (draw * DRAW_KEY_STEP) & MASK32
    ilo, ihi = _row_words(rows)
    mid = torch.tensor(model_id, dtype=torch.int64, device=device)
    word, _, _, _ = philox4x32(
        ilo[:, None], ihi[:, None], cols[None, :], mid, k0, k1 ^ SAMPLING_KEY_TWEAK
    )
    # the top 24 bits, centred: exact in float32 and never 0 or 1
    return ((word >> 8).to(torch.float32) + 0.5) * 2.0**-24
