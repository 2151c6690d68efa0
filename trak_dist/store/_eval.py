"""Ground truth for the LDS of one experiment: subset masks and the subset models' target margins.

Layout (``eval/<exp>/`` in the store)::

    attrs                  settings (recipe, num_models, alpha, seed, n, m, fingerprints)
    masks   [M, n] bool    which train examples subset model j was trained on
    margins [M, m] float32 model j's output f on every target of the experiment
    done    [M] uint8      1 once row j of ``margins`` is written

Complete-or-absent per model (one margins chunk, then its own ``done`` chunk), single writer
(the evaluation's driver); settings are written last, so a group without them is made again.
Margins' fill value is NaN and every chunk carries a crc32c, so damage names the model;
``trak-dist store repair`` un-does it and the next ``trak-dist eval`` retrains it.

The best λ per proj_dim that ``trak-dist eval`` measured (``lambda_reg=best``) is kept in the
attributes under ``best_lambda``, one record per proj_dim (keys: the proj_dim as text). It
lives and dies with the subset models: discarding them (``eval.overwrite=true``) discards the
record too, so a record never outlives what it was measured against.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import zarr

from trak_dist.errors import NonFiniteError, StoreDamagedError, StoreMismatchError, StoreStateError
from trak_dist.store._integrity import (
    Damage,
    checked_read,
    chunk_damage,
    damaged_error,
    delete_chunk,
    store_location,
)
from trak_dist.store._zarr import CHECKSUM, array, group

# settings that define the ground truth: a rerun must match them (num_models may grow)
BEST_KEY = "best_lambda"
DEFINING = ("recipe", "recipe_kwargs", "alpha", "seed", "train_size", "num_targets")


def subset_size(train_size: int, alpha: float) -> int:
    """How many train examples each subset model sees: ``round(alpha·n)``, at least 1."""
    return min(train_size, max(1, round(alpha * train_size)))


def subset_mask(train_size: int, alpha: float, seed: int, index: int) -> np.ndarray:
    """``[n]`` bool: the ``round(alpha·n)`` train examples of subset model ``index``, drawn
    without replacement from a generator seeded by ``(seed, index)`` (independent of M)."""
    size = subset_size(train_size, alpha)
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
        """The eval set of ``exp`` with ``settings``, created if new and grown to
        ``settings["num_models"]``; StoreMismatchError if stored with other ``DEFINING``."""
        n, m, num = settings["train_size"], settings["num_targets"], settings["num_models"]
        if exp in parent and "num_targets" not in group(parent, exp).attrs:
            del parent[exp]  # killed while being created (settings come last): no model is done
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
        for name, cols, dtype, fill in (
            ("masks", (n,), "bool", False),
            ("margins", (m,), "float32", np.nan),
            ("done", (), "uint8", 0),
        ):
            shape, chunks = (num, *cols), (1, *cols)
            node.create_array(
                name, shape=shape, chunks=chunks, dtype=dtype, compressors=CHECKSUM, fill_value=fill
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
        # done last: M is its length, so a grow killed midway is redone (masks written again)
        for arr in (self.masks, self.margins):
            arr.resize((num, *arr.shape[1:]))
        self._write_masks(old, num, dict(self.group.attrs))
        self._done.resize((num,))
        self.group.attrs["num_models"] = num

    @property
    def num_models(self) -> int:
        return int(self._done.shape[0])

    @property
    def settings(self) -> dict[str, Any]:
        return dict(self.group.attrs)

    def best_lambdas(self) -> dict[int, dict[str, Any]]:
        """Every recorded best λ, by proj_dim (built by ``trak_dist.lds``, read by
        ``trak_dist.scoring`` for ``lambda_reg=best``)."""
        raw = self.group.attrs.get(BEST_KEY) or {}
        return {int(p): dict(rec) for p, rec in raw.items()} if isinstance(raw, dict) else {}

    def record_best(self, proj_dim: int, record: dict[str, Any]) -> None:
        """Record (replace) the best λ at ``proj_dim``: one attribute write, so a reader sees the
        old records or the new ones. Single writer: the evaluation's driver, under the lock."""
        records = {str(p): rec for p, rec in self.best_lambdas().items()}
        records[str(int(proj_dim))] = record
        self.group.attrs[BEST_KEY] = records

    def done(self) -> np.ndarray:
        """``[M]`` bool: which subset models' margins are stored (StoreDamagedError: a done flag
        fails its checksum)."""
        no_model_needs_a_flag = np.zeros(self.num_models, dtype=bool)  # absent: not done
        return checked_read(self._done, (slice(0, self.num_models),), no_model_needs_a_flag) != 0

    def done_flags(self) -> tuple[np.ndarray, np.ndarray]:
        """``([M], [M])`` bool: done models, and models whose flag cannot be read (``store
        verify``: their margins decide)."""
        unreadable = np.zeros(self.num_models, dtype=bool)
        try:
            return self.done(), unreadable
        except StoreDamagedError as e:
            for d in _damage(e):
                unreadable[d.chunk[0]] = True
        done = np.zeros(self.num_models, dtype=bool)
        for j in np.flatnonzero(~unreadable).tolist():
            done[j] = bool(np.asarray(self._done[j : j + 1])[0])
        return done, unreadable

    def expected_mask(self, j: int) -> np.ndarray:
        """``[n]`` bool: the subset the settings define for model ``j``."""
        n, alpha, seed = self._subsets()
        return subset_mask(n, alpha, seed, j)

    def _subsets(self) -> tuple[int, float, int]:
        """(train_size, alpha, seed) from the settings: what defines every subset."""
        s = self.group.attrs
        n, alpha, seed = s.get("train_size"), s.get("alpha"), s.get("seed")
        if not (isinstance(n, int) and isinstance(alpha, int | float) and isinstance(seed, int)):
            raise StoreStateError(
                f"the settings of {self.group.path} are train_size={n!r}, alpha={alpha!r}, "
                f"seed={seed!r}; expected integers and a number. Rerun `trak-dist eval` with "
                "eval.overwrite=true to discard its subset models and train them again."
            )
        return n, float(alpha), seed

    def mask_damage(self, j: int) -> Damage | None:
        """What is wrong with model ``j``'s stored mask, or None."""
        d = chunk_damage(self.masks, (j, 0), np.zeros(1, dtype=bool))
        if d is not None:
            return d
        if np.array_equal(np.asarray(self.masks[j]), self.expected_mask(j)):
            return None
        kind = "missing" if not np.asarray(self.masks[j]).any() else "mismatch"
        n = self.masks.shape[1]
        return Damage(self.masks.path, (j, 0), ((j, j + 1), (0, n)), kind)

    def mask(self, j: int) -> np.ndarray:
        """``[n]`` bool: the train examples of subset model ``j``, checked against its settings
        (StoreDamagedError if damaged, missing or different: never train on a bad subset)."""
        d = self.mask_damage(j)
        if d is not None:
            raise damaged_error([d], store_location(self.group))
        return np.asarray(self.masks[j])

    def write(self, j: int, margins: np.ndarray) -> None:
        """Store model ``j``'s target margins ``[m]``, then mark it done (StoreStateError: wrong
        shape; NonFiniteError: a NaN/inf margin, which would make every Spearman it touches NaN)."""
        if margins.shape != (self.margins.shape[1],):
            raise StoreStateError(
                f"subset model {j} returned margins of shape {margins.shape}; the experiment "
                f"has {self.margins.shape[1]} targets."
            )
        with np.errstate(over="ignore"):  # an overflow to inf is refused just below
            stored = margins.astype(np.float32)
        bad = np.flatnonzero(~np.isfinite(stored))
        if len(bad):
            # and NaN is the fill value: stored, they would read as a model never written
            more = " …" if len(bad) > 10 else ""
            raise NonFiniteError(
                f"subset model {j} (recipe {self.group.attrs.get('recipe')!r}) gave non-finite "
                f"outputs on {len(bad)} of the {len(stored)} targets, e.g. target rows "
                f"{bad[:10].tolist()}{more}: nothing of it was stored. Its training diverged "
                "(fix eval.recipe: learning rate, epochs) or those targets hold NaN/inf values; "
                "then rerun `trak-dist eval` (the finished models are kept)."
            )
        self.margins[j] = stored
        self._done[j : j + 1] = 1

    def uncommit(self, models: np.ndarray) -> None:
        """Un-do ``models`` (``store repair``): their flags and margins are removed and their
        masks written again from the settings, so the next evaluation trains them again."""
        for j in np.asarray(models).tolist():
            delete_chunk(self._done, (j,))
            delete_chunk(self.margins, (j, 0))
            self.masks[j] = self.expected_mask(j)

    def recommit(self, models: np.ndarray) -> None:
        """Rewrite the done flags of ``models`` whose margins are whole (``store repair``)."""
        for j in np.asarray(models).tolist():
            self._done[j : j + 1] = 1

    def finished(self, limit: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Masks ``[M', n]`` and margins ``[M', m]`` of the done models among the first
        ``limit`` (StoreDamagedError: a done model's margins or mask are damaged or missing)."""
        idx = np.flatnonzero(self.done()[:limit])
        masks = np.zeros((len(idx), self.masks.shape[1]), bool)
        margins = np.zeros((len(idx), self.margins.shape[1]), np.float32)
        n, alpha, _ = self._subsets()
        size = subset_size(n, alpha)
        damage: list[Damage] = []
        for i, j in enumerate(idx.tolist()):
            try:  # model by model: a not-done model's leftover chunk is never read
                margins[i] = checked_read(self.margins, (slice(j, j + 1), slice(None)))[0]
                masks[i] = checked_read(self.masks, (slice(j, j + 1), slice(None)))[0]
            except StoreDamagedError as e:
                damage += _damage(e)
                continue
            if masks[i].sum() != size:  # a bool chunk has no sentinel: missing reads as empty
                d = self.mask_damage(j)
                damage += [] if d is None else [d]
        if damage:
            raise damaged_error(damage, store_location(self.group))
        return masks, margins


def _damage(e: StoreDamagedError) -> list[Damage]:
    return [d for d in e.damage if isinstance(d, Damage)]
