"""``Pᵀg`` for a ±1 matrix by table lookup: fewer operations than a float matmul (CPU).

For eight rows ``8g … 8g+7`` of P, column j's signs are one byte b = packed[j, g] (see
``_packed.py``), and that column's share of ``Pᵀg`` is the signed sum
``T_g[b] = Σ_k s_k(b) g[8g+k]``: one of only 256 values. Build the 256 sums once per group
and sample, and every one of the p columns costs one lookup-and-add instead of eight
multiply-adds: for p = 2048 the tables hold 256/2048 as many entries as there are lookups, and
the product does an order of magnitude fewer floating-point operations than the dense matmul
(the "method of four Russians").

torch has the kernel this needs: ``embedding_bag(mode="sum")`` gathers rows of a table and sums
them per bag. With the tables as rows ``[256·g + b, :B]`` and one bag of group indices per
column, it returns ``[p, B]``. With fbgemm's CPU kernel behind it, and the tables included,
this is ~4× faster than expanding the packed signs to float32 for MKL's matmul at p = 2048 and
batch 64 (``benchmarks/dense_cnn.py``); below p ≈ 1024 the tables (256 entries a group,
whatever p) cost more than they save. The sums are float32 with a different order of additions
than a matmul, so results agree with ``g @ P`` to float32 rounding.
"""

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
    """``acc_t += (grads_t.T @ P_block).T`` for the rows of P that ``packed`` holds.

    Args:
        acc_t: ``[p, B]`` float32 accumulator (the projection, transposed), updated in place.
        grads_t: ``[8·G, B]`` float32 contiguous: the gradient entries of the block's rows,
            transposed (B innermost, the layout of a table row).
        packed: ``[p, G]`` uint8 packed signs of those rows (``packed_rademacher``).
    """
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

    The lookup is thousands of small ops per micro-batch. Letting each use torch's OpenMP team
    puts a barrier after every one of them, and on a machine with more runnable processes than
    cores a descheduled team member stalls them all: with 2 threads the lookup took ~10× the CPU
    time of 1 thread on this project's shared 2-core machine. Independent jobs (row windows with
    their own accumulators) on separate threads, each op serial, meet once.
    """
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
