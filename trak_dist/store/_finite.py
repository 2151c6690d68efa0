"""Non-finite features are never written: refused, naming the rows, before anything of a batch is
written or staged."""

from __future__ import annotations

import numpy as np

from trak_dist.errors import NonFiniteError


def refuse_non_finite_rows(
    stored: np.ndarray, raw: np.ndarray, q: np.ndarray | None, rows: np.ndarray, who: str
) -> None:
    """Raise NonFiniteError unless every row is finite as stored, before anything is written;
    ``raw`` (float32 as computed) tells float16 overflow from NaN input, ``q`` ``[B]`` or None,
    ``rows`` the ``[B]`` dataset rows, ``who`` ``RowSet.describe``."""
    # one pass over a chunk: negligible next to the gradients that produced it
    bad_x = ~np.isfinite(stored).all(axis=1)
    bad_q = np.zeros_like(bad_x) if q is None else ~np.isfinite(q)
    if not (bad_x.any() or bad_q.any()):
        return
    bad = bad_x | bad_q
    shown = rows[bad][:10].tolist()
    more = " …" if int(bad.sum()) > 10 else ""
    what = "projected gradients" if bad_x.any() else "Q (out-to-loss weights)"
    head = (
        f"non-finite {what} in {who}, rows {shown}{more} ({int(bad.sum())} of the {len(rows)} "
        "being written): nothing was written or committed."
    )
    if bad_x.any() and np.isfinite(raw[bad_x]).all():
        largest = float(np.abs(raw[bad_x]).max())
        raise NonFiniteError(
            f"{head} Their values (max |x| = {largest:.3g}) overflow the store's {stored.dtype}; "
            "store float32 features instead (featurize.half_precision=false, or "
            "use_half_precision=False) in a new store."
        )
    raise NonFiniteError(
        f"{head} Check those samples for NaN/inf values or labels outside the model's classes, "
        "and the checkpoint for NaN/inf weights; then rerun: committed chunks are kept."
    )
