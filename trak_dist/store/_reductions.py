"""Reductions (XᵀX, factorisations): complete or absent (data first, ``complete`` flag last);
a damaged one is recomputed from the checksummed rows."""

from __future__ import annotations

import logging

import numpy as np
import zarr

from trak_dist.errors import StoreDamagedError
from trak_dist.store._codecs import CHECKSUM
from trak_dist.store._integrity import checked_read
from trak_dist.store._layout import bounded_chunks
from trak_dist.store._zarr import array

logger = logging.getLogger(__name__)


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
