"""The store's score sets: each (experiment, proj_dim, λ) variant's S and top-k, complete or
absent (``ScoreSet``), the committed blocks of an unfinished set, and its files on disk."""

from trak_dist.store.scores._set import ScoreSet, variant_name

__all__ = ["ScoreSet", "variant_name"]
