"""``Pᵀg`` for a ±1 matrix by table lookup: fewer operations than a float matmul (CPU).

For rows ``8g … 8g+7`` of P, column j's signs are one byte b (``_packed.py``), so its share of
``Pᵀg`` is one of 256 signed sums ``T_g[b]``: build the sums once per group, then each column
costs a lookup-and-add instead of eight multiply-adds ("method of four Russians").
``embedding_bag(mode="sum")`` is the kernel (tables as rows, one bag per column). ~4× faster
than expanding the signs for MKL's matmul at p = 2048, batch 64 (``benchmarks/dense_cnn.py``);
below p ≈ 1024 the tables cost more than they save. Agrees with ``g @ P`` to float32 rounding."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import torch
from torch.nn.functional import embedding_bag

# signed sums of 4 entries: row v holds the signs (+1 for a 0 bit) of v's 4 bits
_NIBBLE_SIGNS = (1 - 2 * ((torch.arange(16)[:, None] >> torch.arange(4)) & 1)).to(torch.float32)
# tables of one sub-chunk stay this small (in a core's L2) while the p lookups into them run;
# measured on a 2-core EPYC: 2 MiB beat 0.5, 1 and 8 MiB (fewer, larger calls vs cache misses)
_TABLE_BYTES = 2 * 2**20


def groups_per_call(batch: int) -> int:
    """Groups of 8 rows whose tables (``256 · batch`` floats each) fit in ``_TABLE_BYTES``."""
    return max(1, _TABLE_BYTES // (256 * 4 * batch))


def lookup_accumulate(acc_t: torch.Tensor, grads_t: torch.Tensor, packed: torch.Tensor) -> None:
    """``acc_t += (grads_t.T @ P_block).T`` for the rows of P that ``packed`` (``[p, G]`` uint8)
    holds; ``acc_t`` ``[p, B]`` float32 in place, ``grads_t`` ``[8·G, B]`` float32 contiguous."""
    p, batch = acc_t.shape
    n_groups = packed.shape[1]
    if n_groups == 0:
        return
    step = min(n_groups, groups_per_call(batch))
    signs = _NIBBLE_SIGNS.to(acc_t.device)
    tables = torch.empty(step, 16, 16, batch, dtype=torch.float32, device=acc_t.device)
    offsets = torch.arange(step, dtype=torch.int32, device=acc_t.device) * 256
    index = torch.empty(p, step, dtype=torch.int32, device=acc_t.device)
    # signed sums of the low and the high four rows of every group, 16 each: [G, 2, 16, B] in
    # one matmul (one per call cost more in dispatch than in arithmetic)
    halves = torch.matmul(signs, grads_t.view(2 * n_groups, 4, batch))
    halves = halves.view(n_groups, 2, 16, batch)
    for g0 in range(0, n_groups, step):
        g1 = min(n_groups, g0 + step)
        m = g1 - g0
        # all 256 byte sums T[hi·16 + lo] = high[hi] + low[lo]: one broadcast add
        t = tables[:m]
        torch.add(halves[g0:g1, 1, :, None], halves[g0:g1, 0, None], out=t)
        idx = index[:, :m]
        torch.add(offsets[:m], packed[:, g0:g1], out=idx)
        acc_t += embedding_bag(idx, t.view(m * 256, batch), mode="sum")


def run_threads(jobs: list[Callable[[], None]]) -> None:
    """Run ``jobs`` on as many Python threads, every torch op in them single-threaded.

    Thousands of small ops on torch's OpenMP team stall on oversubscribed cores (2 threads took
    ~10× the CPU time of 1 on a shared 2-core machine)."""
    if len(jobs) == 1:
        jobs[0]()
        return
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        pool = _pool(len(jobs))
        for done in [pool.submit(job) for job in jobs]:
            done.result()
    finally:
        torch.set_num_threads(previous)


_POOLS: dict[int, ThreadPoolExecutor] = {}


def _pool(threads: int) -> ThreadPoolExecutor:
    if threads not in _POOLS:
        _POOLS[threads] = ThreadPoolExecutor(threads, thread_name_prefix="trak-dist-lookup")
    return _POOLS[threads]
