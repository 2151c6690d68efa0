"""XᵀX from stored rows and the factorisation of a checkpoint, computed once and kept in the
store (every λ of a sweep reuses it: docs/design.md, invariant 10)."""

from __future__ import annotations

import numpy as np
import torch

from trak_dist.errors import StoreStateError
from trak_dist.scoring._factor import Factorization, gram
from trak_dist.scoring._lambda import rank_bound
from trak_dist.store import FeatureStore, RowSet


def xtx_from_rows(
    rows: RowSet, start: int, end: int, block: int = 8192, device: torch.device | str = "cpu"
) -> np.ndarray:
    """K's Gram (float64) of stored rows ``[start, end)``, read ``block`` rows at a time: XᵀX,
    or GᵀG where the rows hold the sampled-label Fisher's G (``featurize.curvature=fisher``)."""
    out = np.zeros((rows.proj_dim, rows.proj_dim), dtype=np.float64)
    for r0 in range(start, end, block):
        out += gram(rows.read_curvature(r0, min(end, r0 + block)), device)
    return out


def cached_factor(store: FeatureStore, model_id: int, proj_dim: int) -> Factorization | None:
    """The factorisation of XᵀX[:p, :p] for ``model_id`` kept in the store (read once), or None."""
    cached = store.read_factor(model_id, proj_dim)
    return None if cached is None else Factorization(cached[0], cached[1], rank_bound(store.spec))


def ensure_factor(
    store: FeatureStore, model_id: int, proj_dim: int, device: torch.device | str = "cpu"
) -> Factorization:
    """The factorisation of XᵀX[:p, :p] for ``model_id``: read from the store or computed once."""
    cached = cached_factor(store, model_id, proj_dim)
    if cached is not None:
        return cached
    xtx = store.read_xtx(model_id)
    if xtx is None:
        raise StoreStateError(
            f"model_id={model_id} has no XᵀX in {store.where}: its train features are not "
            "finalised. Run finalize_features (or the pipeline's featurise phase) first."
        )
    factor = Factorization.of(
        xtx[:proj_dim, :proj_dim], rank_bound(store.spec), device, f"model_id={model_id}"
    )
    store.write_factor(model_id, proj_dim, factor.eigenvalues, factor.eigenvectors)
    return factor
