"""Reads that check what they read, and the scan for unreadable metadata.

Every chunk carries a crc32c and a fill value committed data never holds (``SENTINEL``), so a
read catches changed bytes, missing files and non-finite values; only on failure are rows
re-read chunk by chunk to name the damaged chunks."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import numpy as np
import zarr
from zarr.core.sync import sync

from trak_dist.errors import StoreDamagedError
from trak_dist.store._chunk_io import all_finite, read_region
from trak_dist.store._layout import EVAL, STAGED

KINDS = {
    "checksum": "fails its checksum (its bytes changed on disk)",
    "missing": "is missing, though committed",
    "unset": "reads as the fill value: rows of it were never written",
    "non-finite": "holds non-finite values",
    "unreadable": "cannot be decoded",
    "mismatch": "differs from the subset its settings define",
}


@dataclass(frozen=True)
class Damage:
    """One damaged chunk: ``array`` is its path in the store (``train/0/X``), ``region`` the
    ``[start, end)`` it covers along each dimension."""

    array: str
    chunk: tuple[int, ...]
    region: tuple[tuple[int, int], ...]
    kind: str

    @property
    def rows(self) -> tuple[int, int]:
        return self.region[0]

    def __str__(self) -> str:
        if self.array.startswith(f"{EVAL}/"):  # one chunk per subset model (store/_eval.py)
            return f"{self.array} of subset model {self.chunk[0]} {KINDS[self.kind]}"
        where = f"rows [{self.rows[0]}, {self.rows[1]})"
        if len(self.region) > 1 and self.chunk[1:] != (0,) * (len(self.chunk) - 1):
            where += ", cols " + ", ".join(f"[{a}, {b})" for a, b in self.region[1:])
        chunk = self.chunk[0] if len(self.chunk) == 1 or not any(self.chunk[1:]) else self.chunk
        what = KINDS[self.kind]
        if f"/{STAGED}/" in self.array:  # a writer's staged rows (store/_staging.py)
            what = what.replace("though committed", "though rows of it are staged")
        return f"{self.array} chunk {chunk} ({where}) {what}"


def store_location(arr: zarr.Array[Any] | zarr.Group) -> str:
    """The store's root as the user named it (a directory for local stores)."""
    store = arr.store_path.store
    root = getattr(store, "root", None)
    return str(root) if root is not None else str(store)


def damaged_error(damage: list[Damage], where: str) -> StoreDamagedError:
    listed = "\n  - ".join(str(d) for d in damage[:20])
    more = f"\n  - … and {len(damage) - 20} more" if len(damage) > 20 else ""
    again = (
        "only these subset models are trained again"
        if all(d.array.startswith(f"{EVAL}/") for d in damage)
        else "only these chunks are featurised again (and what was reduced from them is recomputed)"
    )
    return StoreDamagedError(
        f"{len(damage)} damaged chunk(s) in the store at {where}:\n  - {listed}{more}\n"
        f"Run `trak-dist store repair {where}`, then rerun the same command: {again}.",
        damage,
    )


def bad_values(values: np.ndarray) -> np.ndarray:
    """Elementwise: where ``values`` hold the fill value or a non-finite number."""
    if values.dtype == np.float16 and values.flags.c_contiguous:
        # numpy emulates float16 arithmetic: testing the exponent bits is ~3x faster than
        # isfinite (every read of X runs this)
        return (values.view(np.uint16) & 0x7C00) == 0x7C00
    if values.dtype.kind == "f":
        return ~np.isfinite(values)
    if values.dtype.kind == "u":
        return values == 0  # row hashes (0 is the fill value)
    if values.dtype.kind == "i":
        return values < 0  # indices (-1 is the fill value)
    return np.zeros(values.shape, dtype=bool)


def _chunk_region(arr: zarr.Array[Any], coords: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    return tuple(
        (c * size, min(c * size + size, dim))
        for c, size, dim in zip(coords, arr.chunks, arr.shape, strict=True)
    )


def chunk_damage(
    arr: zarr.Array[Any], coords: tuple[int, ...], rows: np.ndarray | None = None
) -> Damage | None:
    """Read one whole chunk; what is wrong with it, or None. ``rows``: the chunk's rows that must
    hold data (default: all; staged chunks fill only some); without, only the checksum."""
    region = _chunk_region(arr, coords)
    key = f"{arr.path}/{arr.metadata.encode_chunk_key(coords)}"

    def found(kind: str) -> Damage:
        return Damage(arr.path, coords, region, kind)

    needed = rows is None or bool(np.any(rows))
    if not sync(arr.store_path.store.exists(key)):
        return found("missing") if needed else None
    try:
        values = np.asarray(arr[tuple(slice(a, b) for a, b in region)])
    except ValueError as e:
        return found("checksum" if "checksum" in str(e) else "unreadable")
    bad = bad_values(values)
    if rows is not None:
        bad, values = bad[rows], values[rows]
    if bad.any():
        return found(
            "non-finite" if values.dtype.kind == "f" and not np.isnan(values).all() else "unset"
        )
    return None


def delete_chunk(arr: zarr.Array[Any], coords: tuple[int, ...]) -> None:
    """Remove one chunk's stored bytes (it then reads as the fill value: not written)."""
    sync(arr.store_path.store.delete(f"{arr.path}/{arr.metadata.encode_chunk_key(coords)}"))


def locate(
    arr: zarr.Array[Any], region: tuple[tuple[int, int], ...], rows: np.ndarray | None = None
) -> list[Damage]:
    """The damaged chunks among those covering ``region`` (``rows``: see ``checked_read``)."""
    spans = [
        range(a // size, -(-b // size)) for (a, b), size in zip(region, arr.chunks, strict=True)
    ]
    found = []
    for coords in itertools.product(*spans):
        must = None
        if rows is not None:  # the chunk's rows: only those of region flagged in rows
            lo, hi = _chunk_region(arr, coords)[0]
            must = np.zeros(hi - lo, dtype=bool)
            a, b = max(lo, region[0][0]), min(hi, region[0][1])
            must[a - lo : b - lo] = rows[a - region[0][0] : b - region[0][0]]
        found.append(chunk_damage(arr, coords, must))
    return [d for d in found if d is not None]


def checked_read(
    arr: zarr.Array[Any], selection: tuple[slice, ...], rows: np.ndarray | None = None
) -> np.ndarray:
    """``arr[selection]`` (explicit bounds), or StoreDamagedError naming the damaged chunks;
    ``rows``: the selected rows that must hold data (default: all; staged rows may be fill)."""
    region = tuple(
        (s.start or 0, dim if s.stop is None else min(s.stop, dim))
        for s, dim in zip(selection, arr.shape, strict=False)
    )
    region += tuple((0, dim) for dim in arr.shape[len(region) :])
    try:
        direct = read_region(arr, region)
        values = np.asarray(arr[selection]) if direct is None else direct
    except ValueError as e:
        damage = locate(arr, region, rows)
        if not damage:
            raise
        raise damaged_error(damage, store_location(arr)) from e
    if rows is None and not any_bad(values):
        return values
    bad = bad_values(values)
    if rows is not None:
        bad = bad[rows]
    if bad.any():
        damage = locate(arr, region, rows)
        if damage:
            raise damaged_error(damage, store_location(arr))
    return values


def any_bad(values: np.ndarray) -> bool:
    """``bad_values(values).any()`` in one vectorised min/max pass (every read of X runs it;
    the elementwise test is run only where this finds something)."""
    if values.size == 0:
        return False
    if values.dtype.kind == "f":
        return not all_finite([values])
    if values.dtype.kind in "ui":
        low = values.min()
        return bool(low == 0) if values.dtype.kind == "u" else bool(low < 0)
    return bool(bad_values(values).any())
