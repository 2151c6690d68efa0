"""Building the index's X from the store: in memory, or a memory-mapped ``.npy`` written once."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from trak_dist.errors import StoreStateError
from trak_dist.scoring import Factorization, cached_factor, rank_bound
from trak_dist.store import FeatureStore, RowSet

READ_ROWS = 16384  # rows read from the store at a time while the index is built


def stored_factor(store: FeatureStore, model_id: int, p: int) -> Factorization:
    """The stored factorisation (never written here: the service opens the store read-only)."""
    cached = cached_factor(store, model_id, p)
    if cached is not None:
        return cached
    xtx = store.read_xtx(model_id)
    if xtx is None:
        raise StoreStateError(
            f"model_id={model_id} has no XᵀX in {store.where}: its train features are not "
            "finalised. Run the batch job (`trak-dist` with the same overrides) first."
        )
    return Factorization.of(xtx[:p, :p], rank_bound(store.spec), "cpu", f"model_id={model_id}")


def fill(x: torch.Tensor | np.ndarray, rows: Sequence[RowSet], p: int) -> None:
    """Copy every checkpoint's first ``p`` columns into its slot of ``x``."""
    n = x.shape[0]
    for j, rs in enumerate(rows):
        for r0 in range(0, n, READ_ROWS):
            r1 = min(n, r0 + READ_ROWS)
            block = rs.read(r0, r1, p)
            if isinstance(x, torch.Tensor):
                x[r0:r1, j * p : (j + 1) * p] = torch.from_numpy(block)
            else:
                x[r0:r1, j * p : (j + 1) * p] = block


def mapped(
    folder: Path,
    key: dict[str, object],
    dtype: str,
    shape: tuple[int, int],
    rows: Sequence[RowSet],
    p: int,
) -> np.ndarray:
    """X memory-mapped from ``folder``: written once (to a temporary name, then renamed, so a
    killed build leaves no half file that looks whole) and reused while ``key`` matches."""
    folder.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    path = folder / f"index-{digest}-{dtype}.npy"
    if not path.is_file():
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        out = np.lib.format.open_memmap(tmp, mode="w+", dtype=dtype, shape=shape)
        fill(out, rows, p)
        out.flush()
        del out
        os.replace(tmp, path)
    # copy-on-write: torch takes its blocks without a copy (it refuses read-only memory), and
    # the file is never written
    mapped = np.load(path, mmap_mode="c")
    if mapped.shape != shape or mapped.dtype != np.dtype(dtype):
        raise StoreStateError(
            f"the memory-mapped index {path} holds {mapped.shape} {mapped.dtype}, expected "
            f"{shape} {dtype}. Delete it (it is rebuilt from the store)."
        )
    return mapped
