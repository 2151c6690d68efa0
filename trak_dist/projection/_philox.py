"""Philox4x32-10 evaluated on int64 tensors: the counter-based hash behind every projection.

Philox (Salmon et al., SC'11) maps a 128-bit counter and a 64-bit key to 128 random bits with
no state, so any entry of P can be computed alone, on any device (``cuda_ext/`` implements the
same; ``docs/projection.md`` forms counters and keys). torch has no uint32, so words live in
int64; products wrap in two's complement, keeping the low 64 bits exact."""

from __future__ import annotations

import torch

MASK32 = 0xFFFFFFFF
PHILOX_M0 = 0xD2511F53
PHILOX_M1 = 0xCD9E8D57
PHILOX_W0 = 0x9E3779B9
PHILOX_W1 = 0xBB67AE85
ROUNDS = 10


def _mulhilo(a: int, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    prod = b * a  # wraps modulo 2**64; both halves are recovered exactly below
    return (prod >> 32) & MASK32, prod & MASK32


def philox4x32(
    c0: torch.Tensor, c1: torch.Tensor, c2: torch.Tensor, c3: torch.Tensor, k0: int, k1: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Philox4x32-10 on broadcastable int64 tensors holding uint32 words: counter words
    ``c0..c3`` and key words ``k0, k1`` in [0, 2**32); returns the four output words."""
    c0, c1, c2, c3 = torch.broadcast_tensors(c0, c1, c2, c3)
    for r in range(ROUNDS):
        if r:
            k0 = (k0 + PHILOX_W0) & MASK32
            k1 = (k1 + PHILOX_W1) & MASK32
        hi0, lo0 = _mulhilo(PHILOX_M0, c0)
        hi1, lo1 = _mulhilo(PHILOX_M1, c2)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
    return c0, c1, c2, c3
