"""The Zarr store: train features per checkpoint, target features per experiment, reductions.

Layout (one Zarr v3 group)::

    attrs["trak_dist"]            FeatureSpec + codec (invariant 4)
    train/<model_id>/             RowSet X [n, p], Q [n], H [n], done; attrs: checkpoint
                                  fingerprint, bound when the first chunk is committed
    train/<model_id>/xtx          [p, p] float64 XᵀX once every chunk is committed
    train/<model_id>/factor/p<k>/ eigenvalues [k], eigenvectors [k, k] of XᵀX[:k, :k]
    targets/<exp>/<model_id>/     RowSet X [m, p], H [m], done; attrs: checkpoint fingerprint
    <row set>/staged/<writer>/    rows staged by one writer until their chunk is whole: X, Q, H,
                                  has; attrs: the writer's checkpoint (_rows.py, _staging.py)
    scores/<exp>/<variant>/       see ``ScoreSet``
    eval/<exp>/                   see ``EvalSet`` (LDS ground truth, written by trak-dist eval)

Reductions (xtx, factors, scores) are complete or absent: their data is written first and a
``complete`` flag last (scores: renamed into place), and readers treat anything else as absent.
A damaged xtx or factor is recomputed (it is derived from checksummed rows); damaged rows are a
``StoreDamagedError`` (see ``store/_integrity.py`` and ``trak-dist store repair``). The subset
models of ``eval/<exp>`` are complete or absent one by one (margins, then a done flag), and a
damaged one is dropped by repair so that ``trak-dist eval`` trains it again.
"""

from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import zarr

from trak_dist.errors import StoreDamagedError, StoreMismatchError, StoreStateError
from trak_dist.store._codecs import CHECKSUM, DEFAULT_CODEC, compressors
from trak_dist.store._eval import EvalSet
from trak_dist.store._hashes import check_unchanged, describe_rows
from trak_dist.store._integrity import checked_read, unreadable_metadata
from trak_dist.store._lock import store_lock
from trak_dist.store._rows import RowSet
from trak_dist.store._scores import ScoreSet, is_leftover
from trak_dist.store._spec import FORMAT_VERSION, FeatureSpec
from trak_dist.store._zarr import array, attr_int, group, quiet_foreign_nodes

logger = logging.getLogger(__name__)
ATTR = "trak_dist"
ROW_GROUPS = ("train", "targets")  # only trak_dist makes these; traker makes "scores" too
# how long a node's metadata may be half written by another process before it counts as torn
SETTLE_LOOKS = 4
SETTLE_S = 0.25


def settled_unreadable(where: str) -> list[str]:
    """:func:`unreadable_metadata`, less nodes that another process is creating right now.

    Zarr writes a new node's folder before its ``zarr.json``, and the file not atomically, so a
    reader can meet a staged group of a concurrent TRAKer half made. Torn metadata stays torn:
    only what is unreadable at every look, over about a second, is reported.
    """
    bad = set(unreadable_metadata(where))
    for _ in range(SETTLE_LOOKS):
        if not bad:
            break
        time.sleep(SETTLE_S)
        bad &= set(unreadable_metadata(where))
    return sorted(bad)


def check_metadata(where: str) -> None:
    """Raise StoreStateError naming every unreadable ``zarr.json`` of a local store."""
    base = Path(where)
    if "://" in where or not base.is_dir():
        return
    if not (base / "zarr.json").exists() and not any((base / c).exists() for c in ROW_GROUPS):
        return  # no store here yet (a traker save_dir may hold a "scores" folder of its own)
    bad = settled_unreadable(where)
    if not bad:
        return
    if "" in bad:
        raise StoreStateError(
            f"the store's root metadata {Path(where) / 'zarr.json'} is unreadable (cut short, "
            "missing or not Zarr JSON). It holds the store's settings, which cannot be rebuilt: "
            "featurise into a new store path (or overwrite this one: store.overwrite=true, "
            "TRAKer(overwrite=True))."
        )
    files = ", ".join(str(Path(where) / b / "zarr.json") for b in bad)
    raise StoreStateError(
        f"unreadable metadata in the store at {where}: {files} (cut short, missing or not "
        f"Zarr JSON). Run `trak-dist store repair {where}`: it drops what these files "
        "describe, and the next run recomputes it."
    )


class FeatureStore:
    """A trak_dist store on disk (or any Zarr store URL)."""

    def __init__(self, root: zarr.Group, where: str) -> None:
        meta = root.attrs.get(ATTR)
        if not isinstance(meta, dict):
            raise StoreMismatchError(
                f"{where} is a Zarr group but not a trak_dist store (no '{ATTR}' metadata). "
                "Point save_dir/store at a new or trak_dist-written path."
            )
        version = meta.get("spec", {}).get("format_version")
        if version != FORMAT_VERSION:
            raise StoreMismatchError(
                f"{where} is a trak_dist store of format {version}; this trak_dist reads format "
                f"{FORMAT_VERSION} (checksummed chunks, per-row item hashes, reductions marked "
                "complete), so the stored features cannot be checked. Featurise into a new store "
                "path (or overwrite this one: store.overwrite=true, "
                "TRAKer(overwrite=True))."
            )
        self.root = root
        self.where = where
        self.spec = FeatureSpec.from_json(meta["spec"])
        self.codec = str(meta.get("codec", DEFAULT_CODEC))
        self._bound: set[str] = set()

    @classmethod
    def open(cls, path: str | Path, mode: str = "r+", check: bool = True) -> FeatureStore:
        """Open an existing store; its spec is read from its metadata.

        Raises:
            StoreStateError: no store there, or (``check``) some of its metadata is unreadable.
        """
        where = str(path)
        if check:
            check_metadata(where)
        try:
            root = zarr.open_group(where, mode=mode)  # type: ignore[arg-type]
        except FileNotFoundError as e:
            raise StoreStateError(
                f"no trak_dist store at {where}; featurise the train set first."
            ) from e
        return cls(root, where)

    @classmethod
    def create_or_open(
        cls,
        path: str | Path,
        spec: FeatureSpec,
        codec: str = DEFAULT_CODEC,
        overwrite: bool = False,
        row_hashes: np.ndarray | None = None,
    ) -> FeatureStore:
        """Open the store at ``path`` if it holds compatible features, else create it.

        Args:
            row_hashes: the train set's ``[n]`` row hashes (what ``spec.dataset_fingerprint``
                was computed from), to name the rows that changed when the fingerprints differ.

        Raises:
            StoreMismatchError: the store exists with other settings (see FeatureSpec).
        """
        where = str(path)
        compressors(codec)  # validate the name before touching disk
        with store_lock(where):
            if overwrite and Path(where).exists():
                logger.warning("overwriting the existing store at %s", where)
                shutil.rmtree(where)
            check_metadata(where)
            root = zarr.open_group(where, mode="a")
            if ATTR not in root.attrs:
                with quiet_foreign_nodes():  # other tools' files in a shared save_dir are fine
                    foreign = list(root.keys())
                if foreign:
                    raise StoreMismatchError(
                        f"{where} already holds data that trak_dist did not write; use a new path."
                    )
                root.attrs[ATTR] = {"spec": spec.to_json(), "codec": codec}
                for name in ("train", "targets", "scores"):
                    root.require_group(name)
        store = cls(root, where)
        if row_hashes is not None and spec.dataset_fingerprint != store.spec.dataset_fingerprint:
            store._check_rows_unchanged(row_hashes)
        spec.check_compatible(store.spec, where)
        return store

    def _check_rows_unchanged(self, row_hashes: np.ndarray) -> None:
        """Name the train rows whose stored hashes differ from ``row_hashes``."""
        n = self.spec.train_size
        if len(row_hashes) != n:
            return  # check_compatible reports the new size
        for c in self.checkpoint_ids():
            stored = self.train_rows(c).read_hashes(slice(0, n))
            check_unchanged(stored, row_hashes, np.arange(n), f"train (model_id={c})", self.where)

    # ---- train features -------------------------------------------------------------------
    def checkpoint_ids(self) -> list[int]:
        return sorted(int(k) for k in group(self.root, "train").group_keys())

    def ensure_checkpoint(self, model_id: int, fingerprint: str | None = None) -> RowSet:
        """The train RowSet of ``model_id``, created if new; checks the checkpoint it is bound
        to (see ``bind``)."""
        train = group(self.root, "train")
        key = str(int(model_id))
        if key not in train:
            s = self.spec
            rows = RowSet.create(
                train.require_group(key),
                s.train_size,
                s.proj_dim,
                s.chunk_rows,
                s.dtype,
                compressors(self.codec),
                with_q=True,
            )
        else:
            rows = RowSet(group(train, key))
        self._check_bound(rows, fingerprint, f"model_id={model_id}")
        return rows

    def _check_bound(self, rows: RowSet, fingerprint: str | None, what: str) -> None:
        rows.check_bound(fingerprint, what, self.where)

    def bind(self, rows: RowSet, fingerprint: str | None, what: str) -> None:
        """Bind ``rows`` to the checkpoint that featurises them; call before each commit
        (see ``RowSet.bind``; checked once per row set and store object).

        Raises:
            StoreMismatchError: committed rows of ``rows`` come from another checkpoint.
        """
        if not fingerprint or rows.group.path in self._bound:
            return
        rows.bind(fingerprint, what, self.where)
        self._bound.add(rows.group.path)

    def train_rows(self, model_id: int) -> RowSet:
        key = str(int(model_id))
        if key not in group(self.root, "train"):
            raise StoreStateError(
                f"model_id={model_id} has no train features in {self.where}; "
                f"featurised checkpoints: {self.checkpoint_ids()}."
            )
        return RowSet(group(self.root, f"train/{key}"))

    def write_xtx(self, model_id: int, xtx: np.ndarray) -> None:
        node = group(self.root, f"train/{model_id}")
        if "factor" in node:
            del node["factor"]  # factorisations of the XᵀX this one replaces
        self._put(node, "xtx", xtx)

    def read_xtx(self, model_id: int) -> np.ndarray | None:
        """The complete XᵀX, or None (absent, unfinished, or damaged: then it is recomputed)."""
        return self._get(group(self.root, f"train/{model_id}"), "xtx")

    def write_factor(
        self, model_id: int, proj_dim: int, evals: np.ndarray, evecs: np.ndarray
    ) -> None:
        node = group(self.root, f"train/{model_id}").require_group(f"factor/p{proj_dim}")
        self._put(node, "eigenvectors", evecs)
        self._put(node, "eigenvalues", evals)

    def read_factor(self, model_id: int, proj_dim: int) -> tuple[np.ndarray, np.ndarray] | None:
        path = f"train/{model_id}/factor/p{proj_dim}"
        if path not in self.root:
            return None
        node = group(self.root, path)
        evals, evecs = self._get(node, "eigenvalues"), self._get(node, "eigenvectors")
        return None if evals is None or evecs is None else (evals, evecs)

    def drop_reductions(self, model_id: int) -> None:
        """Remove XᵀX and its factorisations of ``model_id`` (``store repair``)."""
        node = group(self.root, f"train/{model_id}")
        for name in ("xtx", "factor"):
            if name in node:
                del node[name]

    # ---- targets ----------------------------------------------------------------------------
    def experiments(self) -> list[str]:
        return sorted(group(self.root, "targets").group_keys())

    def ensure_experiment(self, exp: str, num_targets: int, fingerprint: str | None) -> zarr.Group:
        targets = group(self.root, "targets")
        if exp in targets:
            node = group(targets, exp)
            seen = (node.attrs.get("num_targets"), node.attrs.get("fingerprint"))
            if seen[0] != num_targets or (fingerprint and seen[1] and seen[1] != fingerprint):
                raise StoreMismatchError(
                    f"experiment {exp!r} in {self.where} holds {seen[0]} targets "
                    f"(fingerprint {seen[1]}); now {num_targets} (fingerprint {fingerprint}). "
                    "Use a new experiment name for a different target set."
                )
            return node
        node = targets.require_group(exp)
        node.attrs.update({"num_targets": int(num_targets), "fingerprint": fingerprint})
        return node

    def ensure_target_checkpoint(
        self, exp: str, model_id: int, fingerprint: str | None = None
    ) -> RowSet:
        """The target RowSet of (``exp``, ``model_id``), created if new; checks the checkpoint
        it is bound to (see ``bind``)."""
        node = group(self.root, f"targets/{exp}")
        key = str(int(model_id))
        if key in node:
            rows = RowSet(group(node, key))
        else:
            s = self.spec
            rows = RowSet.create(
                node.require_group(key),
                attr_int(node, "num_targets"),
                s.proj_dim,
                s.chunk_rows,
                s.dtype,
                compressors(self.codec),
                with_q=False,
            )
        self._check_bound(rows, fingerprint, f"targets of {exp!r}, model_id={model_id}")
        return rows

    def target_rows(self, exp: str, model_id: int) -> RowSet:
        path = f"targets/{exp}/{int(model_id)}"
        if path not in self.root:
            raise StoreStateError(
                f"no target features for experiment {exp!r}, model_id={model_id} in "
                f"{self.where}; featurise the targets for every checkpoint first."
            )
        return RowSet(group(self.root, path))

    def num_targets(self, exp: str) -> int:
        if exp not in group(self.root, "targets"):
            raise StoreStateError(
                f"experiment {exp!r} does not exist in {self.where}; known: {self.experiments()}."
            )
        return attr_int(group(self.root, f"targets/{exp}"), "num_targets")

    # ---- scores -----------------------------------------------------------------------------
    def create_scores(
        self, exp: str, variant: str, n: int, m: int, topk: int, attrs: dict[str, Any]
    ) -> ScoreSet:
        parent = group(self.root, "scores").require_group(exp)
        return ScoreSet.create(parent, variant, n, m, topk, self.spec.chunk_rows, attrs)

    def score_set(self, exp: str, variant: str) -> ScoreSet | None:
        path = f"scores/{exp}/{variant}"
        return ScoreSet(group(self.root, path)) if path in self.root else None

    def check_same_items(
        self, rowsets: list[tuple[int, RowSet]], what: str, block: int = 1 << 20
    ) -> None:
        """Raise StoreMismatchError unless every checkpoint's rows hash the same items (read
        ``block`` hashes at a time: memory independent of n)."""
        if len(rowsets) < 2:
            return
        (c0, first), *rest = rowsets
        for r0 in range(0, first.n, block):
            rows = slice(r0, min(first.n, r0 + block))
            ref = first.read_hashes(rows)
            for c, other in rest:
                diff = np.flatnonzero(other.read_hashes(rows) != ref) + r0
                if len(diff):
                    raise StoreMismatchError(
                        f"the {what} features of model_id={c} and model_id={c0} in {self.where} "
                        f"were computed from different items at {describe_rows(diff)}: the data "
                        "changed between checkpoints. Featurise every checkpoint from the same "
                        "data (a new store path, or delete the stale checkpoint's row set)."
                    )

    def score_variants(self, exp: str) -> list[str]:
        """Names of the completed score sets of ``exp`` (not the partial or replaced sets a
        killed scoring may have left beside them)."""
        path = f"scores/{exp}"
        if path not in self.root:
            return []
        names = sorted(v for v in group(self.root, path).group_keys() if not is_leftover(v))
        return [v for v in names if (s := self.score_set(exp, v)) is not None and s.complete]

    # ---- LDS ground truth -------------------------------------------------------------------
    def ensure_eval(self, exp: str, settings: dict[str, Any], overwrite: bool = False) -> EvalSet:
        """The subset models' store of ``exp`` (see ``EvalSet.ensure``)."""
        parent = self.root.require_group("eval")
        if overwrite and exp in parent:
            logger.warning("discarding the LDS ground truth eval/%s in %s", exp, self.where)
            del parent[exp]
        return EvalSet.ensure(parent, exp, settings)

    def eval_set(self, exp: str) -> EvalSet | None:
        """The subset models of ``exp``, if ``trak-dist eval`` has started on it."""
        path = f"eval/{exp}"
        if path not in self.root or "num_targets" not in group(self.root, path).attrs:
            return None
        return EvalSet(group(self.root, path))

    @staticmethod
    def _put(node: zarr.Group, name: str, value: np.ndarray) -> None:
        """Write a reduction: data first, then its ``complete`` flag (complete or absent)."""
        arr = node.create_array(
            name,
            shape=value.shape,
            dtype=value.dtype,
            chunks=value.shape or (1,),
            compressors=CHECKSUM,
            fill_value=np.nan,
            overwrite=True,
            attributes={"complete": False},
        )
        arr[...] = value
        arr.update_attributes({"complete": True})

    @staticmethod
    def _get(node: zarr.Group, name: str) -> np.ndarray | None:
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
