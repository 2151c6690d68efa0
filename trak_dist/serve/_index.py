"""What a query needs from the store, held for exact top-k by blocked matmul.

``compute_scores`` (the score step, scoring/_step.py) scores target t against train row i as

    S[i, t] = (Σ_c X_c[i] · Y_c[t] / C) · (Σ_c Q_c[i] / C),   Y_c = float32(X_tc K_c⁻¹)

with K_c⁻¹ the float64 inverse of checkpoint c (at its resolved λ, scaled as ``kinv_scaling``
says). The index keeps the train side of that formula, and nothing else: the rows of every
checkpoint side by side, ``X = [X_1 … X_C]`` ``[n, C·p]`` as stored (so a float16 store loses
nothing in a float16 index), ``qsum = Σ_c Q_c`` ``[n]`` (float32, summed in checkpoint order as
``compute_scores`` does) and each K_c⁻¹. A query applies K_c⁻¹ on its own side
(``target_side``) and then costs one pass over X, ``block_rows`` rows at a time, keeping only
the running top-k: memory O(block_rows · m) besides the index, whatever n.

The pass is memory-bound for one target and compute-bound for a batch, so (measured in
benchmarks/serve_load.py): X is held as the store's dtype (a float16 store: half the bytes read
per pass, and exact, since every float16 is a float32), each block is widened into one reused
float32 buffer small enough to stay in cache (a fresh 128 MiB block per step cost 5x more than
the matmul), scores are laid out ``[m, rows]`` so that both top-k selections run along
contiguous memory, and Σ_c Q_c / C² is one precomputed weight per row.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

from trak_dist.errors import ConfigError, StoreStateError
from trak_dist.scoring import Factorization, TopK, parse_lambda
from trak_dist.serve._index_build import READ_ROWS, fill, mapped, stored_factor
from trak_dist.store import FeatureStore

INDEX_DTYPES = ("auto", "float32", "float16")  # auto: the store's dtype
# float32 bytes of one block of the top-k pass: 4 MiB stays in this machine's 32 MiB L3 with
# the scores; 2048-row blocks took 82 ms per 1M x 512 float16 pass, 32768-row ones 224 ms
BLOCK_BYTES = 4 << 20


class AttributionIndex:
    """The train side of the scores, for exact top-k over all n train rows.

    Build it with ``from_store``. One query at a time: the pass reuses its float32 buffers (a
    replica's ``Batcher`` runs one batch at a time). Args of the constructor are the parts
    themselves:

    Args:
        x: ``[n, C·p]`` train rows of every checkpoint side by side (a tensor, or a memory-mapped
            array read block by block).
        qsum: ``[n]`` float32 Σ_c Q_c.
        kinvs: per checkpoint, ``[p, p]`` float64 K_c⁻¹ as ``compute_scores`` applies it.
        lambdas: the λ used per checkpoint (as the score set records it).
        block_rows: train rows per matmul block (None: as many as fill ``BLOCK_BYTES`` as float32).
        device: where the matmuls run.
        chunk_rows: train rows scored before each top-k selection.
        threads: chunks scored at once by a pool of threads (CPU), each torch call on one
            core: the pass's chunks are shared out as threads free up, so a core busy with
            something else (the HTTP proxy, a client) slows the pass by its share only. More
            than 1 sets torch's threads to 1 (a replica's setting): a matmul's rounding depends
            on its thread count, and replies must not depend on ``threads``.
    """

    def __init__(
        self,
        x: torch.Tensor | np.ndarray,
        qsum: torch.Tensor,
        kinvs: Sequence[torch.Tensor],
        lambdas: Sequence[float],
        block_rows: int | None = None,
        device: torch.device | str = "cpu",
        chunk_rows: int = 65536,
        threads: int = 1,
        per_target: Sequence[Factorization] | None = None,
    ) -> None:
        self.x = x
        self.device = torch.device(device)
        # kinv_scaling=per_target: each checkpoint's factor scales its target rows (on the
        # index's device once, not per query)
        self.per_target = (
            None if per_target is None else [f.per_target(self.device) for f in per_target]
        )
        self.qsum = qsum.to(self.device, torch.float32)
        self.kinvs = [k.to(self.device, torch.float64) for k in kinvs]
        self.lambdas = list(lambdas)
        self.num_checkpoints = len(self.kinvs)
        self.proj_dim = int(self.kinvs[0].shape[0])
        self.train_size = int(x.shape[0])
        width = int(x.shape[1])
        self.block_rows = block_rows or max(256, BLOCK_BYTES // (4 * width))
        # compute_scores' (acc / C) · (Σ_c Q_c / C) as one weight per row: float32 rounding
        # of the product differs by ≤ 2 ulp (1e-7), far inside the rtol 1e-5 of a reply
        c = self.num_checkpoints
        self.weight = self.qsum / c / c
        # scores are selected chunk by chunk: ~10 small torch calls per top-k merge made
        # 2048-row selections cost ~20% of the pass
        self.chunk_rows = max(chunk_rows, self.block_rows)
        self._local = threading.local()  # per thread: the reused float32 buffer and scores
        # torch's own intra-op threads (OpenMP) made a 1M-row pass slower with 2 than with 1 on
        # this 2-core machine: every ~0.2 ms matmul waited for both cores (benchmarks/RESULTS.md).
        # A new thread starts with OpenMP's default (every core), and a matmul's rounding
        # depends on its thread count: each pool thread uses one, as the replica's own does
        self._pool = (
            ThreadPoolExecutor(threads, initializer=torch.set_num_threads, initargs=(1,))
            if threads > 1
            else None
        )

    @classmethod
    def from_store(
        cls,
        store: FeatureStore,
        model_ids: Sequence[int],
        proj_dim: int | None = None,
        lambda_reg: float | str = "auto",
        kinv_scaling: str = "mean_abs",
        dtype: str = "auto",
        mmap_dir: str | Path | None = None,
        block_rows: int | None = None,
        device: torch.device | str = "cpu",
        threads: int = 1,
    ) -> AttributionIndex:
        """The index of ``store``'s train features of ``model_ids`` at ``proj_dim`` (None: the
        stored width), with the λ ``compute_scores`` would use for ``lambda_reg``.

        ``mmap_dir``: write X there once as ``.npy`` (reused while the store's metadata and these
        settings match) and memory-map it instead of holding it in memory.

        Raises:
            ConfigError: a bad dtype or proj_dim.
            StoreStateError: a checkpoint's train features are incomplete or not finalised.
        """
        if dtype not in INDEX_DTYPES:
            raise ConfigError(f"serve.index_dtype={dtype!r}; expected one of {INDEX_DTYPES}.")
        spec, ids = store.spec, [int(c) for c in model_ids]
        p = spec.proj_dim if proj_dim is None else proj_dim
        if not 1 <= p <= spec.proj_dim:
            raise ConfigError(
                f"proj_dim={p}; the store at {store.where} holds features of width "
                f"{spec.proj_dim}, so any proj_dim in [1, {spec.proj_dim}] can be served."
            )
        if not ids:
            raise ConfigError("no checkpoints to serve: model.checkpoints is empty.")
        lam = parse_lambda(lambda_reg)
        if dtype == "auto":
            dtype = spec.dtype if spec.dtype in INDEX_DTYPES else "float32"
        rows = []
        for c in ids:
            rs = store.train_rows(c)
            if not rs.is_complete():
                raise StoreStateError(
                    f"model_id={c}: the train features in {store.where} are incomplete. Run "
                    "the batch job (`trak-dist` with the same overrides) to finish them first."
                )
            rows.append(rs)
        store.check_same_items(list(zip(ids, rows, strict=True)), "train")
        kinvs, lambdas, factors = [], [], []
        for c in ids:
            factor = stored_factor(store, c, p)
            lam_c = factor.resolve_lambda(lam, f"model_id={c}")
            kinvs.append(torch.as_tensor(factor.kinv(lam_c, kinv_scaling, f"model_id={c}")))
            lambdas.append(lam_c)
            factors.append(factor)
        n = spec.train_size
        qsum = torch.zeros(n, dtype=torch.float32)
        for rs in rows:
            for r0 in range(0, n, READ_ROWS):
                qsum[r0 : r0 + READ_ROWS] += torch.as_tensor(rs.read_q(r0, min(n, r0 + READ_ROWS)))
        width = p * len(ids)
        if mmap_dir is None:
            x: torch.Tensor | np.ndarray = torch.empty((n, width), dtype=getattr(torch, dtype))
            fill(x, rows, p)
        else:
            key = {"store": str(store.where), "spec": spec.to_json(), "ids": ids, "p": p}
            x = mapped(Path(mmap_dir), key, dtype, (n, width), rows, p)
        per_target = factors if kinv_scaling == "per_target" else None
        return cls(
            x, qsum, kinvs, lambdas, block_rows, device, threads=threads, per_target=per_target
        )

    def target_side(self, xt: Sequence[np.ndarray | torch.Tensor]) -> torch.Tensor:
        """``[m, C·p]`` float32 Y: per checkpoint ``float32(float64(x_tc) K_c⁻¹)``, the
        computation (and rounding) of ``compute_scores``.

        Args:
            xt: per checkpoint, ``[m, p]`` target rows rounded to the store's dtype.
        """
        if len(xt) != self.num_checkpoints:
            raise ConfigError(f"{len(xt)} target row sets for {self.num_checkpoints} checkpoints.")
        ys = [
            torch.as_tensor(x, device=self.device).double()[:, : self.proj_dim] @ k
            for x, k in zip(xt, self.kinvs, strict=True)
        ]
        if self.per_target is not None:
            ys = [scale(y) for scale, y in zip(self.per_target, ys, strict=True)]
        return torch.cat([y.float() for y in ys], dim=1)

    def _rows(self, r0: int, r1: int) -> torch.Tensor:
        """Train rows ``[r0, r1)`` of X as float32 on the index's device: a view when X is a
        float32 tensor there, else widened into the reused buffer."""
        xb = self.x[r0:r1]  # a row range: contiguous, also in a memory map
        block = torch.from_numpy(xb) if isinstance(xb, np.ndarray) else xb
        if block.dtype == torch.float32 and block.device == self.device:
            return block
        buffer = getattr(self._local, "buffer", None)
        if buffer is None:
            buffer = self._local.buffer = torch.empty(
                (self.block_rows, block.shape[1]), dtype=torch.float32, device=self.device
            )
        out = buffer[: r1 - r0]
        out.copy_(block)
        return out

    def _chunk(self, y: torch.Tensor, c0: int, c1: int) -> torch.Tensor:
        """Scores ``[m, c1 - c0]`` of train rows ``[c0, c1)``: ``compute_scores``' formula,
        one matmul per block into one reused ``[m, chunk_rows]`` buffer."""
        m = y.shape[0]
        scores = getattr(self._local, "scores", None)
        if scores is None or scores.shape[0] != m:
            scores = self._local.scores = torch.empty((m, self.chunk_rows), device=self.device)
        out = scores[:, : c1 - c0]
        # float32 rows on the device need no widening: one matmul per chunk
        direct = isinstance(self.x, torch.Tensor) and self.x.dtype == torch.float32
        step = self.chunk_rows if direct and self.x.device == self.device else self.block_rows
        for r0 in range(c0, c1, step):
            r1 = min(c1, r0 + step)
            torch.mm(y, self._rows(r0, r1).T, out=out[:, r0 - c0 : r1 - c0])
        return out.mul_(self.weight[c0:c1])

    def _chunks(self) -> range:
        return range(0, self.train_size, self.chunk_rows)

    def scores(self, y: torch.Tensor) -> torch.Tensor:
        """``[n, m]`` float32 scores of targets ``y`` (from ``target_side``); small n only."""
        n = self.train_size
        return torch.cat(
            [self._chunk(y, c0, min(n, c0 + self.chunk_rows)).clone() for c0 in self._chunks()],
            dim=1,
        ).T

    def topk(self, y: torch.Tensor, k: int) -> TopK:
        """Exact top-``k`` proponents and opponents of targets ``y`` (from ``target_side``)."""
        k = min(k, self.train_size)
        chunks = list(self._chunks())
        pool = self._pool if self.device.type == "cpu" and len(chunks) > 1 else None
        # per chunk its top-k, folded in chunk order: the same bits however threads ran them
        parts = (pool.map if pool else map)(lambda c0: self._chunk_topk(y, c0, k), chunks)
        best = worst = None
        for c0, (b, w) in zip(chunks, parts, strict=True):
            best = _merge(best, b, c0, k, largest=True)
            worst = _merge(worst, w, c0, k, largest=False)
        assert best is not None and worst is not None  # n ≥ 1
        return TopK(
            best[1].cpu().numpy(),
            best[0].cpu().numpy(),
            worst[1].cpu().numpy(),
            worst[0].cpu().numpy(),
        )

    def _chunk_topk(
        self, y: torch.Tensor, c0: int, k: int
    ) -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
        """The top-k (values, rows from ``c0``) of both sides of chunk ``c0``'s scores."""
        block = self._chunk(y, c0, min(self.train_size, c0 + self.chunk_rows))
        kk = min(k, block.shape[1])
        best = torch.topk(block, kk, dim=1, largest=True)
        worst = torch.topk(block, kk, dim=1, largest=False)
        return (best.values, best.indices), (worst.values, worst.indices)


def _merge(
    kept: tuple[torch.Tensor, torch.Tensor] | None,
    part: tuple[torch.Tensor, torch.Tensor],
    first_row: int,
    k: int,
    largest: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The running top-``k`` (values, train indices) ``[m, ≤k]`` of ``kept`` and a chunk's
    top list ``part`` (values, rows from ``first_row``) ``[m, ≤k]``, sorted (descending if
    ``largest``); chunks may hold fewer than k rows."""
    vals, idx = part[0], part[1] + first_row
    if kept is not None:
        both = torch.cat([kept[0], vals], dim=1)
        vals, pos = torch.topk(both, min(k, both.shape[1]), dim=1, largest=largest)
        idx = torch.gather(torch.cat([kept[1], idx], dim=1), 1, pos)
    return vals, idx
