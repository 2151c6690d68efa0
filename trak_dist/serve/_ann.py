"""An approximate index (faiss) for n beyond what one exact pass per query affords.

A score is an inner product once the row weight is folded in: ``S[i, t] = (w_i X[i]) · Y[t]``
with ``w = Σ_c Q_c / C²`` (``AttributionIndex``), so the train side is ``w ⊙ X`` ``[n, C·p]``
float32 under any faiss inner-product index (``serve.ann``, a faiss ``index_factory`` string:
``IVF1024,Flat`` keeps the float32 rows, ``IVF4096,SQ8`` one byte per entry, ``…,PQ64`` less).
Proponents are the largest inner products with ``Y``, opponents the largest with ``-Y``. The
scores returned are the index's (exact inner products for ``Flat`` storage, up to float32
rounding); which rows come back is approximate: benchmarks/serve_load.py measures recall@k
against the exact top-k.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from trak_dist.errors import ConfigError
from trak_dist.scoring import TopK
from trak_dist.serve._index import AttributionIndex

TRAIN_ROWS = 65536  # rows sampled to train the coarse quantiser (faiss wants ≥ 39 per list)
ADD_ROWS = 16384  # rows weighted and added at a time (bounds the float32 copy in flight)


def _faiss() -> Any:
    try:
        import faiss
    except ImportError as e:
        raise ConfigError(
            "serve.ann needs faiss: `pip install 'trak_dist[ann]'` (faiss-cpu), or leave "
            "serve.ann unset for the exact index."
        ) from e
    return faiss


class AnnIndex:
    """``AttributionIndex``'s queries (``target_side``, ``topk``), answered by faiss.

    Args:
        exact: the exact index whose rows (and target side) are indexed; its X is read once
            here (memory-map it, ``serve.index_mmap_dir``, when it should not stay in memory).
        factory: a faiss ``index_factory`` description, e.g. ``IVF1024,Flat``.
        nprobe: inverted lists searched per query (IVF indexes; ignored by others).
        seed: which rows train the quantiser.
    """

    def __init__(self, exact: AttributionIndex, factory: str, nprobe: int, seed: int = 0) -> None:
        faiss = _faiss()
        self.exact = exact
        self.train_size = exact.train_size
        self.num_checkpoints = exact.num_checkpoints
        self.proj_dim = exact.proj_dim
        self.lambdas = exact.lambdas
        n, width = exact.train_size, int(exact.x.shape[1])
        try:
            self.index = faiss.index_factory(width, factory, faiss.METRIC_INNER_PRODUCT)
        except RuntimeError as e:
            raise ConfigError(
                f"serve.ann={factory!r} is not a faiss index_factory description ({e}); "
                "expected e.g. 'IVF1024,Flat', 'IVF4096,SQ8' or 'HNSW32,Flat'."
            ) from e
        if not self.index.is_trained:
            rng = np.random.default_rng(seed)
            sample = np.sort(rng.choice(n, min(n, TRAIN_ROWS), replace=False))
            self.index.train(self._weighted(sample))
        for r0 in range(0, n, ADD_ROWS):
            self.index.add(self._weighted(np.arange(r0, min(n, r0 + ADD_ROWS))))
        if "IVF" in factory:
            faiss.ParameterSpace().set_index_parameter(self.index, "nprobe", nprobe)
        faiss.omp_set_num_threads(torch.get_num_threads())

    def _weighted(self, rows: np.ndarray) -> np.ndarray:
        """``[len(rows), C·p]`` float32 ``w ⊙ X`` of train rows ``rows`` (ascending)."""
        x, at = self.exact.x, torch.as_tensor(rows)
        block = torch.from_numpy(np.asarray(x[rows])) if isinstance(x, np.ndarray) else x[at]
        w = self.exact.weight[at.to(self.exact.weight.device)].cpu()
        return (block.cpu().float() * w[:, None]).numpy()

    def target_side(self, xt: Any) -> torch.Tensor:
        """As ``AttributionIndex.target_side``."""
        return self.exact.target_side(xt)

    def topk(self, y: torch.Tensor, k: int) -> TopK:
        """Approximate top-``k`` of targets ``y`` ``[m, C·p]``; an index of -1 (with its score
        -inf or +inf) where the lists searched held fewer than ``k`` rows."""
        k = min(k, self.train_size)
        q = np.ascontiguousarray(y.detach().cpu().float().numpy())
        best_val, best_idx = self.index.search(q, k)
        worst_val, worst_idx = self.index.search(-q, k)
        return TopK(best_idx, best_val, worst_idx, -worst_val)
