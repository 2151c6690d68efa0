"""Score arrays of one (experiment, proj_dim, λ) variant: S (unless only top-k is written) and
per-target top-k.

Complete or absent: written into ``<variant>.partial-<id>``, marked complete, renamed into place
(a failed scoring keeps the old scores); object stores rewrite in place, complete flag last.
A block-wise scoring names its partial set after its plan (``resume``), so a rerun of the same
plan finds it and skips the blocks committed in ``parts/`` (``_parts.py``). Laying out
and removing sets on disk is ``_files.py``'s."""

from __future__ import annotations

import os
import shutil
import uuid
from typing import Any

import numpy as np
import zarr

from trak_dist.errors import ConfigError, StoreStateError
from trak_dist.store._integrity import checked_read
from trak_dist.store._layout import OLD, PARTIAL, TOPK_ARRAYS, bounded_chunks, is_leftover
from trak_dist.store._layout import y as layout_y
from trak_dist.store._tree import Tree
from trak_dist.store._zarr import CHECKSUM, array, attr_int
from trak_dist.store._zarr import group as child
from trak_dist.store.scores._files import (
    discard_set,
    lay_out,
    local_dir,
    remove_dir,
    remove_leftovers,
)
from trak_dist.store.scores._parts import PARTS, ScoreParts

__all__ = ["TOPK_ARRAYS", "ScoreSet", "is_leftover", "variant_name"]


def variant_name(proj_dim: int, lambda_reg: float | str, kinv_scaling: str = "mean_abs") -> str:
    """``p512_lambda0.01`` or ``p512_lambdaauto``: the key of a scoring variant (``_rawkinv``
    appended without scaling, ``_pertarget`` with ``per_target``)."""
    lam = lambda_reg if isinstance(lambda_reg, str) else f"{lambda_reg:g}"
    name = f"p{proj_dim}_lambda{lam}"
    suffixes = {"mean_abs": "", "per_target": "_pertarget", "none": "_rawkinv"}
    if kinv_scaling not in suffixes:  # auto names no variant until the store's spec resolves it
        raise ConfigError(
            f"kinv_scaling={kinv_scaling!r} names no score variant; expected one of "
            f"{sorted(suffixes)} (resolve auto with trak_dist.scoring.resolve_kinv_scaling)."
        )
    return name + suffixes[kinv_scaling]


class ScoreSet:
    """``S [n, m]`` float32 plus the ``k`` highest (proponents) and lowest (opponents) train
    examples of every target; written by the reducer, ``publish`` makes it the variant's.

    ``full`` says whether S was written (``scoring.write_scores``); without it ``S`` is None,
    ``scores()``/``read_rows()`` raise and ``read_topk()`` is what there is."""

    def __init__(self, group: zarr.Group, parent: zarr.Group | None = None, name: str = "") -> None:
        self.group = group
        self.S = array(group, "S") if "S" in group else None
        self.topk = attr_int(group, "topk")
        self._parent = parent
        self._name = name

    @property
    def full(self) -> bool:
        """True when the whole ``[n, m]`` matrix S is stored (not only the top-k)."""
        return self.S is not None

    @property
    def shape(self) -> tuple[int, int]:
        """``(n, m)``: train examples × targets scored (whether or not S is stored)."""
        if self.S is not None:
            return (int(self.S.shape[0]), int(self.S.shape[1]))
        return (attr_int(self.group, "n"), attr_int(self.group, "m"))

    @classmethod
    def resume(
        cls,
        parent: zarr.Group,
        name: str,
        key: str,
        shape: tuple[int, int, int],
        chunks: tuple[int, int],
        full: bool,
        attrs: dict[str, Any],
    ) -> tuple[ScoreSet, bool]:
        """The unfinished set ``<name>.partial-<key>`` of a block-wise scoring (``key``: a hash
        of its plan), created with ``parts/`` for ``shape`` = (ranges, super-blocks, width) if
        absent; other leftovers of ``name`` are removed. True when an earlier run's set was
        found (its committed blocks are kept)."""
        partial = f"{name}{PARTIAL}{key}"
        base = local_dir(parent)
        # object stores have no rename: their unfinished set is the variant itself
        unfinished = partial if base is not None else name
        if unfinished in parent and PARTS in child(parent, unfinished):
            found = child(parent, unfinished)
            if found.attrs.get("plan") == key and not found.attrs.get("complete"):
                return cls(found, parent, name), True
        remove_leftovers(parent, base, name)
        n, m, topk = attrs["n"], attrs["m"], attrs["topk"]
        if base is None:  # object stores: in place, complete flag last (see create)
            group = _emptied(parent, name)
        ranges, blocks, width = shape
        try:
            if base is not None:
                group = parent.create_group(partial)
            lay_out(group, n, m, topk, chunks[0], {**attrs, "plan": key}, full, chunks[1])
            ScoreParts.create(group, ranges, blocks, m, min(topk, n), width)
        except BaseException:
            if base is not None:  # e.g. a full disk while laying out (see create)
                remove_dir(base / partial)
            raise
        return cls(group, parent, name), False

    @property
    def parts(self) -> ScoreParts:
        """The committed blocks of an unfinished block-wise scoring."""
        return ScoreParts(child(self.group, PARTS))

    def drop_parts(self) -> None:
        """Remove ``parts/`` once its top-k are merged (before ``publish``)."""
        base = local_dir(self.group)
        if base is not None:
            # the node first, so that a kill midway leaves no half-listed group behind
            del self.group[PARTS]
            shutil.rmtree(base / PARTS, ignore_errors=True)
        elif PARTS in self.group:
            del self.group[PARTS]

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
        base = local_dir(parent)
        remove_leftovers(parent, base, name)
        if base is None:
            group = _emptied(parent, name)
            lay_out(group, n, m, topk, chunk_rows, attrs)
            return cls(group, parent, name)
        partial = f"{name}{PARTIAL}{uuid.uuid4().hex[:12]}"
        try:
            group = parent.create_group(partial)
            lay_out(group, n, m, topk, chunk_rows, attrs)
        except BaseException:
            # e.g. the disk filled while the metadata was written: zarr may have left a folder
            # with no (or a torn) zarr.json, which only the file system can remove
            remove_dir(base / partial)
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

    @property
    def kinv_scaling(self) -> str:
        """How the set's checkpoints were combined (``scoring.kinv_scaling``, resolved); a set
        written before the attribute existed used traker's ``mean_abs``."""
        return str(self.group.attrs.get("kinv_scaling", "mean_abs"))

    @property
    def complete(self) -> bool:
        return bool(self.group.attrs.get("complete", False))

    def publish(self) -> ScoreSet:
        """Mark complete (all data is written) and put the set in place; returns it there."""
        self.group.attrs["complete"] = True
        if self._parent is None or self.group.basename == self._name:
            return self
        base = local_dir(self._parent)
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
        discard_set(self._parent, self.group, self._name)

    def write_block(self, r0: int, c0: int, block: np.ndarray) -> None:
        if self.S is None:
            raise StoreStateError(f"{self.group.path} holds only top-k; S is not written.")
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

    def y_done(self, model_id: int) -> bool:
        """Whether ``Y/<model_id>`` was written whole (``commit_y``) by an earlier run."""
        done = self.group.attrs.get("y_done", [])
        return isinstance(done, list) and int(model_id) in done

    def commit_y(self, model_id: int) -> None:
        """Mark ``Y/<model_id>`` written (after its data; one writer: the preparer)."""
        done = self.group.attrs.get("y_done", [])
        self.group.attrs["y_done"] = [*(done if isinstance(done, list) else []), int(model_id)]

    def read_y(self, model_id: int, t0: int, t1: int) -> np.ndarray:
        """Rows ``[t0, t1)`` of ``Y/<model_id>`` (read back while this set is written)."""
        return np.asarray(array(self.group, layout_y(model_id))[t0:t1])

    def _check_complete(self) -> None:
        if not self.complete:
            raise StoreStateError(
                f"the scores at {self.group.path} were not completed (a scoring stopped "
                "midway); rerun the scoring."
            )

    def _full(self) -> zarr.Array[Any]:
        self._check_complete()
        if self.S is None:
            n, m = self.shape
            raise StoreStateError(
                f"the scores at {self.group.path} hold only the top-{self.topk} proponents and "
                f"opponents of each target (scoring.write_scores="
                f"{self.group.attrs.get('write_scores_asked', 'topk')}: S [{n}, {m}] would be "
                f"{4 * n * m} bytes). Read them with read_topk(), or rescore with "
                "scoring.write_scores=full for the whole matrix."
            )
        return self.S

    def scores(self) -> np.ndarray:
        """S as one ``[n, m]`` array (reads it whole: mind its size); StoreStateError when
        only the top-k was written (``full`` is False)."""
        s = self._full()
        return checked_read(s, (slice(0, s.shape[0]), slice(0, s.shape[1])))

    def read_rows(self, r0: int, r1: int) -> np.ndarray:
        """Rows ``[r0, r1)`` of S, ``[r1 - r0, m]`` (checked: a damaged chunk is an error)."""
        s = self._full()
        return checked_read(s, (slice(r0, min(r1, s.shape[0])), slice(0, s.shape[1])))

    def read_topk(self) -> dict[str, np.ndarray]:
        """``proponents_idx/val`` and ``opponents_idx/val``, each ``[m, k]``: the k train rows
        of highest (lowest) score per target, ties to the lower row; always written."""
        self._check_complete()
        out = {}
        for key in TOPK_ARRAYS:
            arr = array(self.group, key)
            out[key] = checked_read(arr, (slice(0, arr.shape[0]), slice(0, arr.shape[1])))
        return out


def _emptied(parent: zarr.Group, name: str) -> zarr.Group:
    """The group ``name`` of ``parent`` with nothing in it: every key under it goes, arrays a
    killed writer left without metadata included."""
    Tree(parent.store_path.store).remove(f"{parent.path}/{name}".lstrip("/"))
    return parent.require_group(name)
