"""Typed access to Zarr nodes: ``group[key]`` is typed ``Array | Group``; these narrow it."""

from __future__ import annotations

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
