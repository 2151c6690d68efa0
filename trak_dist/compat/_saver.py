"""A read-only stand-in for traker's ``TRAKer.saver``: what the store holds, in traker's shapes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trak_dist.remote import is_url
from trak_dist.store import FeatureStore


class SaverView:
    """traker's ``saver`` attributes, read live from the store; nothing here writes (every
    property returns a fresh dict). ``variant``: the score variant this TRAKer writes;
    ``current_model_id``: the last loaded checkpoint, or None."""

    def __init__(self, store: FeatureStore, variant: str, current_model_id: int | None) -> None:
        self._store = store
        self._variant = variant
        self.current_model_id = current_model_id
        self.save_dir = store.where if is_url(store.where) else Path(store.where)
        self.train_set_size = store.spec.train_size
        self.proj_dim = store.spec.proj_dim

    @property
    def metadata(self) -> dict[str, Any]:
        """traker's ``metadata.json``: JL dimension, JL matrix type, train set size."""
        spec = self._store.spec
        return {
            "JL dimension": spec.proj_dim,
            "JL matrix type": spec.projection,
            "train set size": spec.train_size,
        }

    @property
    def model_ids(self) -> dict[int, dict[str, int]]:
        """``{model_id: {"is_featurized": 0|1, "is_finalized": 0|1}}`` as in traker."""
        out = {}
        for mid in self._store.checkpoint_ids():
            rows = self._store.train_rows(mid)
            out[mid] = {
                "is_featurized": int(bool(rows.staged.rows_done().all())),
                "is_finalized": int(self._store.read_xtx(mid) is not None),
            }
        return out

    @property
    def experiments(self) -> dict[str, dict[str, Any]]:
        """``{exp: {"num_targets", "scores_path", "scores_finalized"}}`` as in traker;
        ``scores_path`` is the Zarr array ``S`` (read it with ``zarr.open_array(path)[:]``)."""
        out = {}
        for exp in self._store.experiments():
            scores = self._store.score_set(exp, self._variant)
            out[exp] = {
                "num_targets": self._store.num_targets(exp),
                "scores_path": self.scores_path(exp),
                "scores_finalized": int(scores is not None and scores.complete),
            }
        return out

    def scores_path(self, exp: str) -> str:
        """Where ``finalize_scores(exp)`` of this TRAKer writes S (a Zarr array)."""
        return f"{self._store.where.rstrip('/')}/scores/{exp}/{self._variant}/S"
