"""Score arrays of one (experiment, proj_dim, λ) variant: S and per-target top-k.

Complete or absent: written into ``<variant>.partial-<id>``, marked complete, renamed into place
(a failed scoring keeps the old scores); object stores rewrite in place, complete flag last."""

from __future__ import annotations

import logging
import os
import shutil
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import zarr
from zarr.storage import LocalStore

from trak_dist.errors import StoreStateError
from trak_dist.store._codecs import CHECKSUM
from trak_dist.store._integrity import checked_read
from trak_dist.store._layout import OLD, PARTIAL, TOPK_ARRAYS, bounded_chunks, is_leftover
from trak_dist.store._layout import y as layout_y
from trak_dist.store._zarr import array, attr_int
from trak_dist.store._zarr import group as child

__all__ = ["TOPK_ARRAYS", "ScoreSet", "is_leftover", "variant_name"]
logger = logging.getLogger(__name__)
# how long a failed set's folder is kept being removed: zarr writes from I/O threads that can
# outlive the exception which ended the write, and each write makes its parent folders first,
# so a removed folder can come back (1 in ~200 full-disk failures here) for a few ms
REMOVE_SETTLE_S = 0.5


def variant_name(proj_dim: int, lambda_reg: float | str, kinv_scaling: str = "mean_abs") -> str:
    """``p512_lambda0.01`` or ``p512_lambdaauto``: the key of a scoring variant (``_rawkinv``
    appended without scaling)."""
    lam = lambda_reg if isinstance(lambda_reg, str) else f"{lambda_reg:g}"
    name = f"p{proj_dim}_lambda{lam}"
    return name if kinv_scaling == "mean_abs" else f"{name}_rawkinv"


def _local_dir(node: zarr.Group) -> Path | None:
    store = node.store_path.store
    return Path(store.root) / node.path if isinstance(store, LocalStore) else None


class ScoreSet:
    """``S [n, m]`` float32 plus the ``k`` highest (proponents) and lowest (opponents) train
    examples of every target; written by the reducer, ``publish`` makes it the variant's."""

    def __init__(self, group: zarr.Group, parent: zarr.Group | None = None, name: str = "") -> None:
        self.group = group
        self.S = array(group, "S")
        self.topk = attr_int(group, "topk")
        self._parent = parent
        self._name = name

    @classmethod
    def create(
        cls,
        parent: zarr.Group,
        name: str,
        n: int,
        m: int,
        topk: int,
        chunk_rows: int,
        attrs: dict[str, Any],
    ) -> ScoreSet:
        """An empty set; the variant's current set (if any) stays readable until ``publish``."""
        base = _local_dir(parent)
        # a killed scoring's leftovers (one scorer per variant at a time); on disk, also a
        # folder whose zarr.json never got written
        leftovers = (
            [p.name for p in base.iterdir()] if base is not None else list(parent.group_keys())
        )
        for key in leftovers:
            if key.startswith(name + PARTIAL) or key.startswith(name + OLD):
                if base is not None:
                    shutil.rmtree(base / key)
                else:
                    del parent[key]
        if base is None:
            group = parent.require_group(name)
            for key in list(group.keys()):
                del group[key]
            _lay_out(group, n, m, topk, chunk_rows, attrs)
            return cls(group, parent, name)
        partial = f"{name}{PARTIAL}{uuid.uuid4().hex[:12]}"
        try:
            group = parent.create_group(partial)
            _lay_out(group, n, m, topk, chunk_rows, attrs)
        except BaseException:
            # e.g. the disk filled while the metadata was written: zarr may have left a folder
            # with no (or a torn) zarr.json, which only the file system can remove
            _remove_dir(base / partial)
            raise
        return cls(group, parent, name)

    def __enter__(self) -> ScoreSet:
        return self

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        if kind is not None:
            self.discard()

    @property
    def attrs(self) -> dict[str, Any]:
        """What defines the variant: proj_dim, lambda_reg, lambdas (per checkpoint), …"""
        return dict(self.group.attrs)

    def set_attrs(self, **values: Any) -> None:
        """Record more of what defines the set (written into the partial set, so they move into
        place with it when it is published)."""
        self.group.attrs.update(values)

    @property
    def complete(self) -> bool:
        return bool(self.group.attrs.get("complete", False))

    def publish(self) -> ScoreSet:
        """Mark complete (all data is written) and put the set in place; returns it there."""
        self.group.attrs["complete"] = True
        if self._parent is None or self.group.basename == self._name:
            return self
        base = _local_dir(self._parent)
        assert base is not None  # partial groups exist only in local stores
        final, old = base / self._name, None
        if final.exists():
            old = base / f"{self._name}{OLD}{uuid.uuid4().hex[:12]}"
            os.rename(final, old)
        os.rename(base / self.group.basename, final)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        return ScoreSet(child(self._parent, self._name))

    def discard(self) -> None:
        """Remove a partial set after a failed scoring (best effort: the disk may be full)."""
        _discard(self._parent, self.group, self._name)

    def write_block(self, r0: int, c0: int, block: np.ndarray) -> None:
        self.S[r0 : r0 + block.shape[0], c0 : c0 + block.shape[1]] = block

    def write_topk(self, c0: int, values: dict[str, np.ndarray]) -> None:
        for key in TOPK_ARRAYS:
            v = values[key]
            array(self.group, key)[c0 : c0 + v.shape[0]] = v

    def create_y(self, model_id: int, m: int, p: int, block: int) -> None:
        """Lay out ``Y/<model_id>`` (``[m, p]`` float32, X_target K⁻¹ of one checkpoint),
        written ``block`` target rows at a time (its chunks' rows)."""
        self.group.create_array(
            layout_y(model_id),
            shape=(m, p),
            chunks=bounded_chunks((m, p), 4, rows=min(m, block)),
            dtype="float32",
            compressors=CHECKSUM,
            overwrite=True,
        )

    def write_y(self, model_id: int, t0: int, y: np.ndarray) -> None:
        """Rows ``[t0, t0 + len(y))`` of ``Y/<model_id>`` (whole row chunks: see create_y)."""
        array(self.group, layout_y(model_id))[t0 : t0 + y.shape[0]] = y

    def read_y(self, model_id: int, t0: int, t1: int) -> np.ndarray:
        """Rows ``[t0, t1)`` of ``Y/<model_id>`` (read back while this set is written)."""
        return np.asarray(array(self.group, layout_y(model_id))[t0:t1])

    def _check_complete(self) -> None:
        if not self.complete:
            raise StoreStateError(
                f"the scores at {self.group.path} were not completed (a scoring stopped "
                "midway); rerun the scoring."
            )

    def scores(self) -> np.ndarray:
        """S as one ``[n, m]`` array (reads it whole: mind its size)."""
        self._check_complete()
        return checked_read(self.S, (slice(0, self.S.shape[0]), slice(0, self.S.shape[1])))

    def read_rows(self, r0: int, r1: int) -> np.ndarray:
        """Rows ``[r0, r1)`` of S, ``[r1 - r0, m]`` (checked: a damaged chunk is an error)."""
        self._check_complete()
        return checked_read(
            self.S, (slice(r0, min(r1, self.S.shape[0])), slice(0, self.S.shape[1]))
        )

    def read_topk(self) -> dict[str, np.ndarray]:
        self._check_complete()
        out = {}
        for key in TOPK_ARRAYS:
            arr = array(self.group, key)
            out[key] = checked_read(arr, (slice(0, arr.shape[0]), slice(0, arr.shape[1])))
        return out


def _lay_out(
    group: zarr.Group, n: int, m: int, topk: int, chunk_rows: int, attrs: dict[str, Any]
) -> None:
    """The empty arrays of a score set (S, and the top-k per target), marked incomplete."""
    group.attrs.update({**attrs, "topk": int(topk), "complete": False})
    group.create_array(
        "S",
        shape=(n, m),
        chunks=(min(n, chunk_rows), min(m, 1024)),
        dtype="float32",
        compressors=CHECKSUM,
        fill_value=np.nan,
    )
    k = min(topk, n)
    for key in TOPK_ARRAYS:
        idx = key.endswith("idx")
        group.create_array(
            key,
            shape=(m, k),
            chunks=(min(m, 4096), max(k, 1)),
            dtype="int64" if idx else "float32",
            compressors=CHECKSUM,
            fill_value=-1 if idx else np.nan,
        )


def _discard(parent: zarr.Group | None, group: zarr.Group, name: str) -> None:
    if parent is None or group.basename == name:
        return
    base = _local_dir(parent)
    if base is not None:
        _remove_dir(base / group.basename)
        return
    try:
        del parent[group.basename]
    except OSError as e:
        logger.warning("could not remove the partial scores %s: %s", group.path, e)


def _remove_dir(path: Path) -> None:
    """Remove a failed set's folder (best effort: the disk may be full; a failure is logged,
    never raised over the error that failed the set), and again for REMOVE_SETTLE_S while
    zarr's lagging I/O threads may recreate it."""
    deadline = time.monotonic() + REMOVE_SETTLE_S
    while True:
        try:
            shutil.rmtree(path)
        except FileNotFoundError:
            pass  # gone already, or never made
        except OSError as e:
            logger.warning("could not remove the partial scores %s: %s", path, e)
            return
        if time.monotonic() >= deadline:
            return
        time.sleep(0.05)
