"""The Zarr store: train features per checkpoint, target features per experiment, reductions.

Layout: ``store/_layout.py``. Reductions are complete or absent (``complete`` flag last) and
recomputed when damaged; damaged rows are a ``StoreDamagedError`` (``store repair``)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import zarr

from trak_dist.errors import StoreDamagedError, StoreMismatchError, StoreStateError
from trak_dist.store import _layout as layout
from trak_dist.store._binding import (
    check_rows_unchanged,
    check_same_items,
    committed_hashes,
    rebind_dataset,
)
from trak_dist.store._eval import EvalSet
from trak_dist.store._integrity import checked_read
from trak_dist.store._layout import bounded_chunks
from trak_dist.store._lock import store_lock
from trak_dist.store._metadata import ATTR, check_metadata, remove_store, store_meta
from trak_dist.store._object_store import open_zarr
from trak_dist.store._rows import RowSet
from trak_dist.store._spec import FeatureSpec
from trak_dist.store._zarr import (
    CHECKSUM,
    DEFAULT_CODEC,
    array,
    attr_int,
    compressors,
    group,
    quiet_foreign_nodes,
)
from trak_dist.store.scores import ScoreSet

logger = logging.getLogger(__name__)


class FeatureStore:
    """A trak_dist store on disk or on object storage (``s3://…``, ``gs://…``: ``options`` are
    its ``store.options``, see ``trak_dist/remote/_client.py``)."""

    def __init__(
        self, root: zarr.Group, where: str, options: Mapping[str, Any] | None = None
    ) -> None:
        meta = store_meta(root.attrs.get(ATTR), where)
        self.root = root
        self.where = where
        self.options = dict(options or {})
        self.spec = FeatureSpec.from_json(meta["spec"])
        self.codec = str(meta.get("codec", DEFAULT_CODEC))
        self._bound: set[str] = set()

    @classmethod
    def open(
        cls,
        path: str | Path,
        mode: str = "r+",
        check: bool = True,
        options: Mapping[str, Any] | None = None,
    ) -> FeatureStore:
        """Open an existing store, its spec read from its metadata (StoreStateError: none there,
        or with ``check``, unreadable metadata)."""
        where = str(path)
        zstore = open_zarr(where, options, read_only=mode == "r")
        if check:
            check_metadata(zstore, where)
        try:
            root = zarr.open_group(zstore, mode=mode)  # type: ignore[arg-type]
        except FileNotFoundError as e:
            raise StoreStateError(
                f"no trak_dist store at {where}; featurise the train set first."
            ) from e
        return cls(root, where, options)

    @staticmethod
    def stored_spec(
        path: str | Path, options: Mapping[str, Any] | None = None
    ) -> FeatureSpec | None:
        """The spec of the trak_dist store at ``path``, or None where there is none yet."""
        where = str(path)
        try:
            root = zarr.open_group(open_zarr(where, options, read_only=True), mode="r")
        except (FileNotFoundError, KeyError, ValueError):
            return None
        meta = root.attrs.get(ATTR)
        if not isinstance(meta, dict) or "spec" not in meta:
            return None
        return FeatureSpec.from_json(meta["spec"])

    @classmethod
    def create_or_open(
        cls,
        path: str | Path,
        spec: FeatureSpec,
        codec: str = DEFAULT_CODEC,
        overwrite: bool = False,
        row_hashes: np.ndarray | None = None,
        options: Mapping[str, Any] | None = None,
    ) -> FeatureStore:
        """Open the store at ``path`` if it holds compatible features, else create it
        (StoreMismatchError for other settings); ``row_hashes``: the train set's ``[n]`` row
        hashes, to name changed rows when the fingerprints differ."""
        where = str(path)
        compressors(codec)  # validate the name before touching disk
        zstore = open_zarr(where, options)
        with store_lock(where, options=options):
            if overwrite:
                remove_store(zstore, where)
            check_metadata(zstore, where)
            root = zarr.open_group(zstore, mode="a")
            if ATTR not in root.attrs:
                with quiet_foreign_nodes():  # other tools' files in a shared save_dir are fine
                    foreign = list(root.keys())
                if foreign:
                    raise StoreMismatchError(
                        f"{where} already holds data that trak_dist did not write; use a new path."
                    )
                root.attrs[ATTR] = {"spec": spec.to_json(), "codec": codec}
                for name in (layout.TRAIN, layout.TARGETS, layout.SCORES):
                    root.require_group(name)
            store = cls(root, where, options)
            # the train set is bound by what was committed (_binding.py): a rerun with a
            # fixed row (a NaN in it stopped the first run before its chunk was committed)
            # takes the store over; a committed row that changed is refused below
            train_sets = [(c, store.train_rows(c)) for c in store.checkpoint_ids()]
            was = rebind_dataset(root, ATTR, spec.to_json(), train_sets, row_hashes)
            if was is not None:
                logger.info(
                    "%s: bound to the train set %s (was %s): no committed row differs",
                    where,
                    spec.dataset_fingerprint,
                    was,
                )
                store = cls(root, where, options)
        if row_hashes is not None and spec.dataset_fingerprint != store.spec.dataset_fingerprint:
            stored = [(c, committed_hashes(rows)[1]) for c, rows in train_sets]
            check_rows_unchanged(stored, row_hashes, where)
        spec.check_compatible(store.spec, where)
        return store

    # ---- train features -------------------------------------------------------------------
    def checkpoint_ids(self) -> list[int]:
        return sorted(int(k) for k in group(self.root, layout.TRAIN).group_keys())

    def ensure_checkpoint(
        self, model_id: int, fingerprint: str | None = None, source: str | None = None
    ) -> RowSet:
        """The train RowSet of ``model_id``, created if new; checks the checkpoint it is bound
        to (see ``bind``; ``source``, the checkpoint's path, for the message)."""
        draws = self.spec.fisher_draws if self.spec.curvature == "fisher" else 0
        rows = self._ensure_rows(layout.train(model_id), self.spec.train_size, True, draws)
        rows.binding.check(fingerprint, _model_id(model_id, source), self.where)
        return rows

    def _ensure_rows(self, path: str, n: int, with_q: bool, g_draws: int = 0) -> RowSet:
        if path in self.root:
            return RowSet(group(self.root, path))
        s, node = self.spec, self.root.require_group(path)
        codec = compressors(self.codec)
        return RowSet.create(node, n, s.proj_dim, s.chunk_rows, s.dtype, codec, with_q, g_draws)

    def bind(self, rows: RowSet, fingerprint: str | None, what: str) -> None:
        """Bind ``rows`` to the checkpoint that featurises them before each commit
        (``CheckpointBinding.bind``); StoreMismatchError if committed rows come from another."""
        if not fingerprint or rows.group.path in self._bound:
            return
        rows.bind(fingerprint, what, self.where)
        self._bound.add(rows.group.path)

    def train_rows(self, model_id: int) -> RowSet:
        path = layout.train(model_id)
        if path not in self.root:
            raise StoreStateError(
                f"model_id={model_id} has no train features in {self.where}; "
                f"featurised checkpoints: {self.checkpoint_ids()}."
            )
        return RowSet(group(self.root, path))

    def write_xtx(self, model_id: int, xtx: np.ndarray) -> None:
        node = group(self.root, layout.train(model_id))
        if layout.FACTOR in node:
            del node[layout.FACTOR]  # factorisations of the XᵀX this one replaces
        put_reduction(node, layout.XTX, xtx)

    def read_xtx(self, model_id: int) -> np.ndarray | None:
        """The complete XᵀX, or None (absent, unfinished, or damaged: then it is recomputed)."""
        return get_reduction(group(self.root, layout.train(model_id)), layout.XTX)

    def write_factor(
        self, model_id: int, proj_dim: int, evals: np.ndarray, evecs: np.ndarray
    ) -> None:
        node = self.root.require_group(layout.factor(model_id, proj_dim))
        put_reduction(node, "eigenvectors", evecs)
        put_reduction(node, "eigenvalues", evals)

    def read_factor(self, model_id: int, proj_dim: int) -> tuple[np.ndarray, np.ndarray] | None:
        path = layout.factor(model_id, proj_dim)
        if path not in self.root:
            return None
        node = group(self.root, path)
        evals, evecs = get_reduction(node, "eigenvalues"), get_reduction(node, "eigenvectors")
        return None if evals is None or evecs is None else (evals, evecs)

    # ---- targets ----------------------------------------------------------------------------
    def experiments(self) -> list[str]:
        return sorted(group(self.root, layout.TARGETS).group_keys())

    def ensure_experiment(self, exp: str, num_targets: int, fingerprint: str | None) -> zarr.Group:
        if layout.experiment(exp) in self.root:
            node = group(self.root, layout.experiment(exp))
            seen = (node.attrs.get("num_targets"), node.attrs.get("fingerprint"))
            if seen[0] != num_targets or (fingerprint and seen[1] and seen[1] != fingerprint):
                raise StoreMismatchError(
                    f"experiment {exp!r} in {self.where} holds {seen[0]} targets "
                    f"(fingerprint {seen[1]}); now {num_targets} (fingerprint {fingerprint}). "
                    "Use a new experiment name for a different target set."
                )
            return node
        node = self.root.require_group(layout.experiment(exp))
        node.attrs.update({"num_targets": int(num_targets), "fingerprint": fingerprint})
        return node

    def ensure_target_checkpoint(
        self, exp: str, model_id: int, fingerprint: str | None = None, source: str | None = None
    ) -> RowSet:
        """The target RowSet of (``exp``, ``model_id``), created if new; checks the checkpoint
        it is bound to (see ``bind``; ``source`` as in ``ensure_checkpoint``)."""
        m = attr_int(group(self.root, layout.experiment(exp)), "num_targets")
        rows = self._ensure_rows(layout.targets(exp, model_id), m, with_q=False)
        what = f"targets of {exp!r}, {_model_id(model_id, source)}"
        rows.binding.check(fingerprint, what, self.where)
        return rows

    def target_rows(self, exp: str, model_id: int) -> RowSet:
        path = layout.targets(exp, model_id)
        if path not in self.root:
            raise StoreStateError(
                f"no target features for experiment {exp!r}, model_id={model_id} in "
                f"{self.where}; featurise the targets for every checkpoint first."
            )
        return RowSet(group(self.root, path))

    def num_targets(self, exp: str) -> int:
        if layout.experiment(exp) not in self.root:
            raise StoreStateError(
                f"experiment {exp!r} does not exist in {self.where}; known: {self.experiments()}."
            )
        return attr_int(group(self.root, layout.experiment(exp)), "num_targets")

    # ---- scores -----------------------------------------------------------------------------
    def create_scores(
        self, exp: str, variant: str, n: int, m: int, topk: int, attrs: dict[str, Any]
    ) -> ScoreSet:
        parent = self.root.require_group(layout.scores(exp))
        return ScoreSet.create(parent, variant, n, m, topk, self.spec.chunk_rows, attrs)

    def resume_scores(
        self, exp: str, variant: str, key: str, grid: tuple[int, int, int], *args: Any
    ) -> tuple[ScoreSet, bool]:
        """The unfinished set of a block-wise scoring of ``exp`` (``ScoreSet.resume``: ``key``
        names its plan, ``grid`` its blocks; ``args``: chunks, full, attrs)."""
        parent = self.root.require_group(layout.scores(exp))
        return ScoreSet.resume(parent, variant, key, grid, *args)

    def unfinished_scores(self, path: str, variant: str = "") -> ScoreSet:
        """The unfinished score set at ``path`` (its ``group.path``), which another process may
        have prepared; StoreStateError when it is gone."""
        if path not in self.root:
            raise StoreStateError(
                f"the unfinished score set {path} is gone: another scoring of {variant!r} "
                "replaced it. Rerun the scoring."
            )
        return ScoreSet(group(self.root, path), group(self.root, path.rpartition("/")[0]), variant)

    def score_set(self, exp: str, variant: str) -> ScoreSet | None:
        path = layout.scores(exp, variant)
        return ScoreSet(group(self.root, path)) if path in self.root else None

    def check_same_items(self, rowsets: list[tuple[int, RowSet]], what: str) -> None:
        """Raise StoreMismatchError unless every checkpoint's rows hash the same items."""
        check_same_items(rowsets, what, self.where)

    def score_variants(self, exp: str) -> list[str]:
        """Names of the completed score sets of ``exp`` (not the partial or replaced sets a
        killed scoring may have left beside them)."""
        path = layout.scores(exp)
        if path not in self.root:
            return []
        names = sorted(v for v in group(self.root, path).group_keys() if not layout.is_leftover(v))
        return [v for v in names if (s := self.score_set(exp, v)) is not None and s.complete]

    # ---- LDS ground truth -------------------------------------------------------------------
    def ensure_eval(self, exp: str, settings: dict[str, Any], overwrite: bool = False) -> EvalSet:
        """The subset models' store of ``exp`` (see ``EvalSet.ensure``)."""
        parent = self.root.require_group(layout.EVAL)
        if overwrite and exp in parent:
            logger.warning("discarding the LDS ground truth eval/%s in %s", exp, self.where)
            del parent[exp]
        return EvalSet.ensure(parent, exp, settings)

    def eval_set(self, exp: str) -> EvalSet | None:
        """The subset models of ``exp``, if ``trak-dist eval`` has started on it."""
        path = layout.eval_set(exp)
        if path not in self.root or "num_targets" not in group(self.root, path).attrs:
            return None
        return EvalSet(group(self.root, path))


def put_reduction(node: zarr.Group, name: str, value: np.ndarray) -> None:
    """Write a reduction: data first, then its ``complete`` flag (complete or absent)."""
    arr = node.create_array(
        name,
        shape=value.shape,
        dtype=value.dtype,
        chunks=bounded_chunks(value.shape, value.dtype.itemsize),
        compressors=CHECKSUM,
        fill_value=np.nan,
        overwrite=True,
        attributes={"complete": False},
    )
    arr[...] = value
    arr.update_attributes({"complete": True})


def get_reduction(node: zarr.Group, name: str) -> np.ndarray | None:
    """A complete reduction, or None; a damaged one is reported and treated as absent
    (reductions are recomputed from the checksummed rows)."""
    if name not in node:
        return None
    arr = array(node, name)
    if arr.attrs.get("complete") is not True:
        return None
    try:
        return checked_read(arr, tuple(slice(0, d) for d in arr.shape))
    except StoreDamagedError as e:
        logger.warning("%s: recomputing it", str(e).splitlines()[1].strip(" -"))
        return None


def _model_id(model_id: int, source: str | None) -> str:
    """``model_id=1`` or ``model_id=1 (PATH)``: a Hub checkpoint's path names its commit."""
    return f"model_id={model_id}" if source is None else f"model_id={model_id} ({source})"
