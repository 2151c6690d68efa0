"""Typed access to Zarr nodes (``group[key]`` is typed ``Array | Group``; these narrow it), and
quiet listing of groups that share a directory with other files."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from typing import Any

import zarr

from trak_dist.errors import StoreStateError


def group(parent: zarr.Group, path: str) -> zarr.Group:
    node = parent[path]
    if not isinstance(node, zarr.Group):
        raise StoreStateError(f"{path!r} in the store is an array, expected a group.")
    return node


def array(parent: zarr.Group, path: str) -> zarr.Array[Any]:
    node = parent[path]
    if not isinstance(node, zarr.Array):
        raise StoreStateError(f"{path!r} in the store is a group, expected an array.")
    return node


def attr_int(node: zarr.Group | zarr.Array[Any], key: str) -> int:
    value = node.attrs.get(key)
    if not isinstance(value, int):
        raise StoreStateError(f"store attribute {key!r} is {value!r}, expected an integer.")
    return value


@contextlib.contextmanager
def quiet_foreign_nodes() -> Iterator[None]:
    """Silence zarr's "not recognized as a component of a Zarr hierarchy" warnings while listing
    a group: a traker ``save_dir`` holds foreign files we never read."""
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message=".*not recognized as a component of a Zarr hierarchy"
        )
        yield
