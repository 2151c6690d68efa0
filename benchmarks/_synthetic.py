"""Stores for rows that no model produced (benchmarks and tests of the store and the scorer)."""

from __future__ import annotations

from trak_dist.store import FeatureSpec


def synthetic_spec(n: int, p: int, dtype: str = "float16", chunk_rows: int = 256) -> FeatureSpec:
    """The spec of n synthetic rows of width p (placeholder task, dataset and gradient size)."""
    return FeatureSpec(
        proj_dim=p,
        projection="rademacher",
        seed=0,
        grad_wrt=None,
        model_output="synthetic",
        grad_dim=p,
        train_size=n,
        dataset_fingerprint="synthetic",
        dtype=dtype,
        chunk_rows=chunk_rows,
    )
