"""Ground truth for the LDS of one experiment: subset masks and the subset models' target margins.

Layout (``eval/<exp>/`` in the store)::

    attrs                  settings (recipe, num_models, alpha, seed, n, m, fingerprints)
    masks   [M, n] bool    which train examples subset model j was trained on
    margins [M, m] float32 model j's output f on every target of the experiment
    done    [M] uint8      1 once row j of ``margins`` is written

Complete-or-absent per model: row j of ``margins`` is one chunk (one store key, written to a
temporary file and renamed by the LocalStore), and ``done[j]`` is its own chunk, set after it.
A killed evaluation leaves every model either done or not started; a rerun trains only the
ones not done. Only the evaluation's driver writes (a single writer).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import zarr

from trak_dist.errors import StoreMismatchError, StoreStateError
from trak_dist.store._zarr import array, group

# settings that define the ground truth: a rerun must match them (num_models may grow)
DEFINING = ("recipe", "recipe_kwargs", "alpha", "seed", "train_size", "num_targets")


def subset_mask(train_size: int, alpha: float, seed: int, index: int) -> np.ndarray:
    """``[n]`` bool: the ``round(alpha·n)`` train examples of subset model ``index``, drawn
    without replacement from a generator seeded by ``(seed, index)`` (independent of M)."""
    size = min(train_size, max(1, round(alpha * train_size)))
    mask = np.zeros(train_size, dtype=bool)
    mask[np.random.default_rng([seed, index]).choice(train_size, size, replace=False)] = True
    return mask


class EvalSet:
    """The ``eval/<exp>`` group of a store (see the module docstring)."""

    def __init__(self, group: zarr.Group) -> None:
        self.group = group
        self.masks = array(group, "masks")
        self.margins = array(group, "margins")
        self._done = array(group, "done")

    @classmethod
    def ensure(cls, parent: zarr.Group, exp: str, settings: dict[str, Any]) -> EvalSet:
        """The eval set of ``exp`` with ``settings`` (see ``DEFINING``), created if new and grown
        if ``settings["num_models"]`` exceeds the stored M.

        Raises:
            StoreMismatchError: the stored ground truth was made with other settings.
        """
        n, m, num = settings["train_size"], settings["num_targets"], settings["num_models"]
        if exp in parent:
            node = group(parent, exp)
            stored = dict(node.attrs)
            diffs = [
                f"{k}: stored {stored.get(k)!r}, requested {settings[k]!r}"
                for k in DEFINING
                if stored.get(k) != settings[k]
            ]
            if diffs:
                raise StoreMismatchError(
                    f"the LDS ground truth eval/{exp} in the store was made with other "
                    "settings:\n  - " + "\n  - ".join(diffs) + "\nRerun with the stored "
                    "settings, or pass eval.overwrite=true to discard its subset models."
                )
            ev = cls(node)
            if num > ev.num_models:
                ev._grow(num)
            return ev
        node = parent.require_group(exp)
        node.create_array("masks", shape=(num, n), chunks=(1, n), dtype="bool", fill_value=False)
        node.create_array(
            "margins",
            shape=(num, m),
            chunks=(1, m),
            dtype="float32",
            compressors=None,
            fill_value=np.nan,
        )
        node.create_array(
            "done", shape=(num,), chunks=(1,), dtype="uint8", compressors=None, fill_value=0
        )
        ev = cls(node)
        ev._write_masks(0, num, settings)
        node.attrs.update(settings)  # last: attrs present means the masks are written
        return ev

    def _write_masks(self, start: int, end: int, settings: dict[str, Any]) -> None:
        n, alpha, seed = settings["train_size"], settings["alpha"], settings["seed"]
        for j in range(start, end):
            self.masks[j] = subset_mask(n, alpha, seed, j)

    def _grow(self, num: int) -> None:
        old = self.num_models
        for arr in (self.masks, self.margins, self._done):
            arr.resize((num, *arr.shape[1:]))
        self._write_masks(old, num, dict(self.group.attrs))
        self.group.attrs["num_models"] = num

    @property
    def num_models(self) -> int:
        return int(self._done.shape[0])

    @property
    def settings(self) -> dict[str, Any]:
        return dict(self.group.attrs)

    def done(self) -> np.ndarray:
        """``[M]`` bool: which subset models' margins are stored."""
        return np.asarray(self._done[:]).astype(bool)

    def mask(self, j: int) -> np.ndarray:
        return np.asarray(self.masks[j])

    def write(self, j: int, margins: np.ndarray) -> None:
        """Store model ``j``'s target margins ``[m]``, then mark it done."""
        if margins.shape != (self.margins.shape[1],):
            raise StoreStateError(
                f"subset model {j} returned margins of shape {margins.shape}; the experiment "
                f"has {self.margins.shape[1]} targets."
            )
        self.margins[j] = margins.astype(np.float32)
        self._done[j : j + 1] = 1

    def finished(self, limit: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Masks ``[M', n]`` and margins ``[M', m]`` of the M' models that are done (among the
        first ``limit``)."""
        idx = np.flatnonzero(self.done()[:limit])
        if not len(idx):
            return np.zeros((0, self.masks.shape[1]), bool), np.zeros((0, self.margins.shape[1]))
        return (
            np.asarray(self.masks.get_orthogonal_selection((idx, slice(None)))),
            np.asarray(self.margins.get_orthogonal_selection((idx, slice(None)))),
        )
