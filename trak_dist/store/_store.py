"""The Zarr store: train features per checkpoint, target features per experiment, reductions.

Layout (one Zarr v3 group)::

    attrs["trak_dist"]            FeatureSpec + codec (invariant 4)
    train/<model_id>/             RowSet X [n, p], Q [n], done; attrs: checkpoint fingerprint
    train/<model_id>/xtx          [p, p] float64 XᵀX once every chunk is committed
    train/<model_id>/factor/p<k>/ eigenvalues [k], eigenvectors [k, k] of XᵀX[:k, :k]
    targets/<exp>/<model_id>/     RowSet X [m, p], done
    <row set>/staged/<writer>/    rows staged by one writer until their chunk is whole (_rows.py)
    scores/<exp>/<variant>/       see ``ScoreSet``
    eval/<exp>/                   see ``EvalSet`` (LDS ground truth, written by trak-dist eval)
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import zarr

from trak_dist.errors import StoreMismatchError, StoreStateError
from trak_dist.store._codecs import DEFAULT_CODEC, compressors
from trak_dist.store._eval import EvalSet
from trak_dist.store._lock import store_lock
from trak_dist.store._rows import RowSet
from trak_dist.store._scores import ScoreSet
from trak_dist.store._spec import FeatureSpec
from trak_dist.store._zarr import array, attr_int, group, quiet_foreign_nodes

logger = logging.getLogger(__name__)
ATTR = "trak_dist"


class FeatureStore:
    """A trak_dist store on disk (or any Zarr store URL)."""

    def __init__(self, root: zarr.Group, where: str) -> None:
        meta = root.attrs.get(ATTR)
        if not isinstance(meta, dict):
            raise StoreMismatchError(
                f"{where} is a Zarr group but not a trak_dist store (no '{ATTR}' metadata). "
                "Point save_dir/store at a new or trak_dist-written path."
            )
        self.root = root
        self.where = where
        self.spec = FeatureSpec.from_json(meta["spec"])
        self.codec = str(meta.get("codec", DEFAULT_CODEC))

    @classmethod
    def open(cls, path: str | Path, mode: str = "r+") -> FeatureStore:
        """Open an existing store; its spec is read from its metadata."""
        where = str(path)
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
    ) -> FeatureStore:
        """Open the store at ``path`` if it holds compatible features, else create it.

        Raises:
            StoreMismatchError: the store exists with other settings (see FeatureSpec).
        """
        where = str(path)
        compressors(codec)  # validate the name before touching disk
        with store_lock(where):
            if overwrite and Path(where).exists():
                logger.warning("overwriting the existing store at %s", where)
                shutil.rmtree(where)
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
        spec.check_compatible(store.spec, where)
        return store

    # ---- train features -------------------------------------------------------------------
    def checkpoint_ids(self) -> list[int]:
        return sorted(int(k) for k in group(self.root, "train").group_keys())

    def ensure_checkpoint(self, model_id: int, fingerprint: str | None = None) -> RowSet:
        """The train RowSet of ``model_id``, created if new; checks the checkpoint fingerprint."""
        train = group(self.root, "train")
        key = str(int(model_id))
        if key not in train:
            node = train.require_group(key)
            node.attrs["checkpoint"] = fingerprint
            s = self.spec
            return RowSet.create(
                node,
                s.train_size,
                s.proj_dim,
                s.chunk_rows,
                s.dtype,
                compressors(self.codec),
                with_q=True,
            )
        node = group(train, key)
        stored = node.attrs.get("checkpoint")
        if fingerprint and stored and stored != fingerprint:
            raise StoreMismatchError(
                f"model_id={model_id} in {self.where} was featurised from a different checkpoint "
                f"(fingerprint {stored}, now {fingerprint}). Give each checkpoint its own model_id."
            )
        return RowSet(node)

    def train_rows(self, model_id: int) -> RowSet:
        key = str(int(model_id))
        if key not in group(self.root, "train"):
            raise StoreStateError(
                f"model_id={model_id} has no train features in {self.where}; "
                f"featurised checkpoints: {self.checkpoint_ids()}."
            )
        return RowSet(group(self.root, f"train/{key}"))

    def write_xtx(self, model_id: int, xtx: np.ndarray) -> None:
        self._put(group(self.root, f"train/{model_id}"), "xtx", xtx)

    def read_xtx(self, model_id: int) -> np.ndarray | None:
        node = group(self.root, f"train/{model_id}")
        return np.asarray(array(node, "xtx")[:]) if "xtx" in node else None

    def write_factor(
        self, model_id: int, proj_dim: int, evals: np.ndarray, evecs: np.ndarray
    ) -> None:
        node = group(self.root, f"train/{model_id}").require_group(f"factor/p{proj_dim}")
        self._put(node, "eigenvectors", evecs)
        self._put(node, "eigenvalues", evals)  # written last: its presence marks completion

    def read_factor(self, model_id: int, proj_dim: int) -> tuple[np.ndarray, np.ndarray] | None:
        path = f"train/{model_id}/factor/p{proj_dim}"
        if path not in self.root or "eigenvalues" not in group(self.root, path):
            return None
        node = group(self.root, path)
        return np.asarray(array(node, "eigenvalues")[:]), np.asarray(array(node, "eigenvectors")[:])

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

    def ensure_target_checkpoint(self, exp: str, model_id: int) -> RowSet:
        node = group(self.root, f"targets/{exp}")
        key = str(int(model_id))
        if key in node:
            return RowSet(group(node, key))
        s = self.spec
        m = attr_int(node, "num_targets")
        return RowSet.create(
            node.require_group(key),
            m,
            s.proj_dim,
            s.chunk_rows,
            s.dtype,
            compressors(self.codec),
            with_q=False,
        )

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

    def score_variants(self, exp: str) -> list[str]:
        """Names of the completed score sets of ``exp``."""
        path = f"scores/{exp}"
        if path not in self.root:
            return []
        names = sorted(group(self.root, path).group_keys())
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
    def _put(node: zarr.Group, name: str, value: np.ndarray, **kw: Any) -> None:
        arr = node.create_array(
            name,
            shape=value.shape,
            dtype=value.dtype,
            chunks=value.shape or (1,),
            compressors=None,
            overwrite=True,
            **kw,
        )
        arr[...] = value
