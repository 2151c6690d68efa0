"""The Rademacher matrix at one bit per entry, packed along rows, and its expansion to ±1.

``packed_rademacher`` returns ``[p, groups]`` uint8: bit ``k`` of ``[j, g]`` is set where
``P[8g + k, j] = −1``. Eight rows per byte is what the lookup product (``_lookup.py``) needs;
it is 32× smaller than float32 (95 MB for 373k parameters at p = 2048). A second
implementation of the hash's sign layout: tests check it against ``rademacher_block``."""

from __future__ import annotations

import sys

import torch

from trak_dist.projection._philox import MASK32, philox4x32

PACK = 8  # rows of P per byte
_WORK_BYTES = 32 * 2**20
_BIG_ENDIAN = sys.byteorder == "big"
_SIGNS: dict[tuple[torch.dtype, str], torch.Tensor] = {}


def _le_bytes(x: torch.Tensor) -> torch.Tensor:
    """int64 ``[...]`` → uint8 ``[..., 8]``, least significant byte first on any host."""
    b = x.contiguous().view(torch.uint8).view(*x.shape, 8)
    return b.flip(-1) if _BIG_ENDIAN else b


def _le_int64(b: torch.Tensor) -> torch.Tensor:
    """uint8 ``[..., 8]`` (least significant byte first) → int64 ``[...]``."""
    b = b.flip(-1) if _BIG_ENDIAN else b
    return b.contiguous().view(torch.int64).view(b.shape[:-1])


def _transpose8(x: torch.Tensor) -> torch.Tensor:
    """Transpose the 8×8 bit matrix in each int64 (byte r, bit c → byte c, bit r).

    Hacker's Delight §7-3: three delta swaps. Arithmetic right shifts only smear the sign into
    bits that every mask clears, so int64 serves for uint64."""
    t = (x ^ (x >> 7)) & 0x00AA00AA00AA00AA
    x = x ^ t ^ (t << 7)
    t = (x ^ (x >> 14)) & 0x0000CCCC0000CCCC
    x = x ^ t ^ (t << 14)
    t = (x ^ (x >> 28)) & 0x00000000F0F0F0F0
    return x ^ t ^ (t << 28)


def packed_rademacher(
    seed: int,
    model_id: int,
    group_start: int,
    group_end: int,
    proj_dim: int,
    device: torch.device | str = "cpu",
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Rows ``[8·group_start, 8·group_end)`` of the Rademacher P, eight rows per byte:
    ``[proj_dim, groups]`` uint8 (into ``out`` if given), bit ``k`` of ``[j, g]`` set where
    ``P[8·(group_start + g) + k, j] = −1``."""
    n_groups = group_end - group_start
    if out is None:
        out = torch.empty(proj_dim, n_groups, dtype=torch.uint8, device=device)
    if n_groups == 0:
        return out
    n_blocks = -(-proj_dim // 128)
    col_bytes = n_blocks * 16  # bytes of one row: columns 8b … 8b+7 in byte b
    jblocks = torch.arange(n_blocks, dtype=torch.int64, device=device)
    mid = torch.tensor(model_id, dtype=torch.int64, device=device)
    k0, k1 = seed & MASK32, (seed >> 32) & MASK32
    # Philox's int64 words are the largest intermediates: 8 bytes per 32 entries
    step = max(1, _WORK_BYTES // (PACK * n_blocks * 4 * 8 * 8))
    for g0 in range(0, n_groups, step):
        g1 = min(n_groups, g0 + step)
        rows = torch.arange(
            PACK * (group_start + g0), PACK * (group_start + g1), dtype=torch.int64, device=device
        )
        words = philox4x32(
            (rows & MASK32)[:, None], (rows >> 32)[:, None], jblocks[None, :], mid, k0, k1
        )
        # each 32-bit word (in an int64) → its 4 bytes: [groups, 8 rows, col_bytes]
        row_bytes = _le_bytes(torch.stack(words, dim=-1))[..., :4]
        row_bytes = row_bytes.reshape(g1 - g0, PACK, col_bytes)
        # eight rows' byte b in one int64 (byte k = row k), bit-transposed: byte c then holds
        # column 8b+c's eight rows (bit k = row k)
        tiles = _transpose8(_le_int64(row_bytes.transpose(1, 2)))
        cols = _le_bytes(tiles).reshape(g1 - g0, col_bytes * PACK)
        out[:, g0:g1] = cols[:, :proj_dim].T
    return out


def _sign_rows(dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``[256, 8]``: row b holds the signs (+1 for a 0 bit) of b's bits, least significant first."""
    key = (dtype, str(device))
    if key not in _SIGNS:
        byte = torch.arange(256, dtype=torch.int64)[:, None]
        bits = byte >> torch.arange(PACK, dtype=torch.int64) & 1
        _SIGNS[key] = (1 - 2 * bits).to(dtype=dtype, device=device)
    return _SIGNS[key]


def expand_packed(packed: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``[p, groups]`` packed signs → ``[p, 8·groups]`` ±1: the block ``Pᵀ`` in ``dtype``."""
    table = _sign_rows(dtype, packed.device)
    p, n_groups = packed.shape
    # a byte → its 8 signs through a 256-row table: one gather per 8 entries
    return torch.nn.functional.embedding(packed.to(torch.int32), table).reshape(p, PACK * n_groups)
