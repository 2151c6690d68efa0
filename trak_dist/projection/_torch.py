"""The torch projector: P from the reference hash, on any device (the default on CPU).
Rademacher P is kept packed (``_packed.py``); ``Pᵀg`` by table lookup on CPU at
p ≥ ``LOOKUP_MIN_DIM`` (``_lookup.py``), else by float32 row blocks and a matmul."""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Iterator

import torch

from trak_dist.errors import ConfigError
from trak_dist.projection._base import (
    GradBlock,
    GradInput,
    ProjectionKind,
    Projector,
    as_blocks,
    check_model_id,
)
from trak_dist.projection._generate import normal_block, rademacher_block
from trak_dist.projection._lookup import lookup_accumulate, run_threads
from trak_dist.projection._packed import PACK, expand_packed, packed_rademacher

_GENERATORS = {ProjectionKind.RADEMACHER: rademacher_block, ProjectionKind.NORMAL: normal_block}
# below this p the lookup tables (256 entries per 8 rows) cost more than they save over a
# float32 matmul (measured crossover ~600 at batch 64 on CPU; benchmarks/dense_cnn.py)
LOOKUP_MIN_DIM = 1024
METHODS = ("auto", "lookup", "matmul")


class TorchProjector(Projector):
    """Reference projector (Rademacher or normal) on any torch device.

    Cache: a Rademacher P is kept packed (``ceil(d/8)·p`` bytes: 95.6 MB for d = 373,322 at
    p = 2048, vs 3.06 GB in float32), generated on a checkpoint's first ``project`` and kept
    until another ``model_id`` comes or ``free_memory``. Beyond ``cache_bytes`` (512 MiB) only
    its first rows (whole ``block_rows`` windows) are kept, the rest regenerated on every call;
    a normal P is cached whole only when ``d·p·4 ≤ cache_bytes``. Working set beyond the
    cache: a window of transposed gradient rows and half sums (~10 MiB at batch 64), tables
    (≤ 2 MiB) and a ``[p, B]`` accumulator (matmul path: a float32 ``block_rows × p`` block).
    Several torch threads spread windows over Python threads (``run_threads``).

    Args:
        kind: ``rademacher`` or ``normal``.
        cache_bytes: the most bytes of P kept between calls.
        block_rows: rows of P handled at once (rounded up to a multiple of 8).
        method: Rademacher ``Pᵀg`` by ``lookup`` (``_lookup.py``), ``matmul``, or ``auto``
            (lookup on CPU at p ≥ ``LOOKUP_MIN_DIM``); all agree to float32 rounding.
    """

    def __init__(
        self,
        grad_dim: int,
        proj_dim: int,
        seed: int = 0,
        kind: ProjectionKind | str = ProjectionKind.RADEMACHER,
        device: torch.device | str = "cpu",
        cache_bytes: int = 512 * 2**20,
        block_rows: int = 8192,
        method: str = "auto",
    ) -> None:
        super().__init__(grad_dim, proj_dim, seed)
        self.kind = ProjectionKind(kind)
        if self.kind not in _GENERATORS:
            raise ConfigError(f"TorchProjector does not generate {self.kind.value} matrices.")
        if block_rows < 1 or cache_bytes < 0:
            raise ConfigError(
                f"block_rows={block_rows}, cache_bytes={cache_bytes}; expected block_rows ≥ 1 "
                "and cache_bytes ≥ 0."
            )
        if method not in METHODS:
            raise ConfigError(f"method={method!r}; expected one of {METHODS}.")
        self.method = method
        self.device = torch.device(device)
        self.cache_bytes = cache_bytes
        self.block_rows = -(-block_rows // PACK) * PACK
        self._cached: tuple[int, torch.Tensor] | None = None

    @property
    def cached_groups(self) -> int:
        """Groups of 8 rows of a Rademacher P kept packed between calls (the cache rule)."""
        groups = -(-self.grad_dim // PACK)
        if groups * self.proj_dim <= self.cache_bytes:
            return groups
        window = self.block_rows // PACK
        return self.cache_bytes // self.proj_dim // window * window

    def matrix(self, model_id: int, row_start: int = 0, row_end: int | None = None) -> torch.Tensor:
        """``P[row_start:row_end, :proj_dim]`` as float32 ``[rows, p]`` (the reference)."""
        row_end = self.grad_dim if row_end is None else row_end
        return _GENERATORS[self.kind](
            self.seed, model_id, row_start, row_end, 0, self.proj_dim, torch.float32, self.device
        )

    def _cache(
        self, model_id: int, make: Callable[[int, int], torch.Tensor], size: int
    ) -> torch.Tensor:
        if self._cached is None or self._cached[0] != model_id:
            self._cached = None  # release the old one before generating the next
            self._cached = (model_id, make(model_id, size))
        return self._cached[1]

    def _packed(self, model_id: int, g0: int, g1: int) -> torch.Tensor:
        """``[p, g1 - g0]`` packed signs of groups ``[g0, g1)``: cached or generated now."""
        if g1 <= self.cached_groups:
            whole = self._cache(model_id, self._make_packed, self.cached_groups)
            return whole[:, g0:g1]
        return packed_rademacher(self.seed, model_id, g0, g1, self.proj_dim, self.device)

    def _make_packed(self, model_id: int, groups: int) -> torch.Tensor:
        """The packed cache, its row ranges generated on torch's thread count (``run_threads``:
        the hash is hundreds of mid-sized integer ops, the same hazard as the lookup's)."""
        whole = torch.empty(self.proj_dim, groups, dtype=torch.uint8, device=self.device)
        threads = max(1, min(torch.get_num_threads(), groups // 1024))
        cuts = [groups * k // threads for k in range(threads + 1)]

        def job(a: int, b: int) -> None:
            packed_rademacher(
                self.seed, model_id, a, b, self.proj_dim, self.device, out=whole[:, a:b]
            )

        run_threads([functools.partial(job, a, b) for a, b in itertools.pairwise(cuts)])
        return whole

    def _make_dense(self, model_id: int, rows: int) -> torch.Tensor:
        return self.matrix(model_id, 0, rows)

    def project(self, grads: GradInput, model_id: int) -> torch.Tensor:
        model_id = check_model_id(model_id)
        blocks = as_blocks(grads)
        self._check_blocks(blocks)
        if self.kind is ProjectionKind.NORMAL:
            return self._project_normal(blocks, model_id)
        batch = blocks[0].grad.shape[0]
        lookup = batch > 0 and (
            self.method == "lookup"
            or (
                self.method == "auto"
                and self.device.type == "cpu"
                and self.proj_dim >= LOOKUP_MIN_DIM
            )
        )
        if lookup:
            return self._project_lookup(blocks, model_id, batch)
        acc = torch.zeros(batch, self.proj_dim, dtype=torch.float32, device=self.device)
        for r0, r1, pieces in self._windows(blocks):
            block_t = expand_packed(self._packed(model_id, r0 // PACK, r1 // PACK))  # P[r0:r1]ᵀ
            for off, g in pieces:
                a, b = max(off, r0), min(off + g.shape[1], r1)
                g_part = g[:, a - off : b - off].to(device=self.device, dtype=torch.float32)
                acc.addmm_(g_part, block_t[:, a - r0 : b - r0].T)
        return acc

    def _project_lookup(self, blocks: list[GradBlock], model_id: int, batch: int) -> torch.Tensor:
        """Table lookup, windows spread over torch's thread count (see ``run_threads``)."""
        windows = list(self._windows(blocks))
        if not windows:
            return torch.zeros(batch, self.proj_dim, dtype=torch.float32, device=self.device)
        if self.cached_groups:
            self._packed(model_id, 0, 0)  # fill the cache here, not in a race of threads
        threads = min(torch.get_num_threads(), len(windows))
        accs = [torch.zeros(self.proj_dim, batch, device=self.device) for _ in range(threads)]

        def job(k: int) -> None:
            for r0, r1, pieces in windows[k::threads]:
                signs = self._packed(model_id, r0 // PACK, r1 // PACK)
                rows_t = _rows_transposed(pieces, r0, r1, batch, self.device)
                lookup_accumulate(accs[k], rows_t, signs)

        run_threads([functools.partial(job, k) for k in range(threads)])
        return torch.stack(accs).sum(0).T.contiguous() if threads > 1 else accs[0].T.contiguous()

    def _windows(self, blocks: list[GradBlock]) -> Iterator[tuple[int, int, list[GradBlock]]]:
        """Row windows ``[r0, r1)`` (aligned to 8 and to the ``block_rows`` grid, so never
        across the cache's end) with the blocks that overlap each."""
        step = self.block_rows
        for start, end, run in _runs(blocks, step):
            for w0 in range(start // step * step, end, step):
                r0 = max(w0, start // PACK * PACK)
                r1 = min(w0 + step, -(-end // PACK) * PACK)
                pieces = [b for b in run if b.offset < r1 and b.offset + b.grad.shape[1] > r0]
                if pieces:
                    yield r0, r1, pieces

    def _project_normal(self, blocks: list[GradBlock], model_id: int) -> torch.Tensor:
        batch = blocks[0].grad.shape[0]
        out = torch.zeros(batch, self.proj_dim, dtype=torch.float32, device=self.device)
        full = None
        if self.grad_dim * self.proj_dim * 4 <= self.cache_bytes:
            full = self._cache(model_id, self._make_dense, self.grad_dim)
        for offset, g in blocks:
            g = g.to(device=self.device, dtype=torch.float32)
            n = g.shape[1]
            if full is not None:
                out.addmm_(g, full[offset : offset + n])
                continue
            for r0 in range(0, n, self.block_rows):
                r1 = min(n, r0 + self.block_rows)
                out.addmm_(g[:, r0:r1], self.matrix(model_id, offset + r0, offset + r1))
        return out

    def free_memory(self) -> None:
        self._cached = None


def _runs(blocks: list[GradBlock], gap: int) -> list[tuple[int, int, list[GradBlock]]]:
    """Blocks sorted by offset and merged into runs ``(start, end, blocks)``; a run breaks only
    where ``gap`` or more rows are covered by no block (overlapping blocks add up)."""
    runs: list[tuple[int, int, list[GradBlock]]] = []
    for b in sorted(blocks, key=lambda b: b.offset):
        end = b.offset + b.grad.shape[1]
        if runs and b.offset < runs[-1][1] + gap:
            start, last, run = runs[-1]
            runs[-1] = (start, max(last, end), [*run, b])
        else:
            runs.append((b.offset, end, [b]))
    return runs


def _rows_transposed(
    pieces: list[GradBlock], r0: int, r1: int, batch: int, device: torch.device
) -> torch.Tensor:
    """``[r1 - r0, B]`` float32: the gradient entries of rows ``[r0, r1)``, zero where no block
    has any, summed where blocks overlap."""
    out = torch.zeros(r1 - r0, batch, dtype=torch.float32, device=device)
    for off, g in pieces:
        a, b = max(off, r0), min(off + g.shape[1], r1)
        out[a - r0 : b - r0] += g[:, a - off : b - off].T.to(device)
    return out


class IdentityProjector(Projector):
    """``P = I``: the gradients themselves (traker's NoOpProjector); ``proj_dim == grad_dim``."""

    kind = ProjectionKind.IDENTITY

    def __init__(self, grad_dim: int, proj_dim: int | None = None, seed: int = 0) -> None:
        super().__init__(grad_dim, grad_dim if proj_dim is None else proj_dim, seed)
        if self.proj_dim != self.grad_dim:
            raise ConfigError(
                f"an identity projection keeps every gradient entry: proj_dim={proj_dim} must "
                f"equal grad_dim={grad_dim} (or be left unset)."
            )

    def project(self, grads: GradInput, model_id: int) -> torch.Tensor:
        check_model_id(model_id)
        blocks = as_blocks(grads)
        self._check_blocks(blocks)
        first = blocks[0].grad
        out = torch.zeros(first.shape[0], self.grad_dim, dtype=torch.float32, device=first.device)
        for offset, g in blocks:
            out[:, offset : offset + g.shape[1]] = g
        return out
