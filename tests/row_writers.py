"""Process entry points for tests that write one row set from several real processes."""

from __future__ import annotations

import numpy as np

from trak_dist.store import FeatureStore, store_lock

P = 8


def row_values(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The X (``[B, P]``) and Q (``[B]``) every writer stores for ``rows``: exact in float16."""
    rows = np.asarray(rows, dtype=np.int64)
    x = (rows[:, None] % 251) + np.arange(P)[None, :] / 8.0
    return x.astype(np.float32), (rows % 7).astype(np.float32)


def item_hashes(rows: np.ndarray) -> np.ndarray:
    """``[B]`` uint64 stand-ins for the items' hashes (never 0, the "not written" value)."""
    return np.asarray(rows, dtype=np.uint64) * np.uint64(2654435761) + np.uint64(1)


def write_share(store: str, rows: list[list[int]], writer: str) -> None:
    """Write each batch of ``rows`` as TRAKer does: write_rows, then fold if the lock is free."""
    rs = FeatureStore.open(store).train_rows(0)
    for batch in rows:
        inds = np.asarray(batch, dtype=np.int64)
        x, q = row_values(inds)
        touched = rs.staged.write_rows(inds, x, q, h=item_hashes(inds), writer=writer)
        if len(touched):
            with store_lock(store, wait=False) as free:
                if free:
                    rs.staged.fold(touched)
