"""How the store's arrays are encoded and accessed in Zarr: compression codecs chosen by name,
the checksum every chunk carries, typed access to nodes (``group[key]`` is typed
``Array | Group``; these narrow it), and quiet listing of groups that share a directory with
other files.

Default codec "none": projected gradients barely compress (under 10 % at several times the write
cost, ``benchmarks/store_codecs.py``). A crc32c ends every chain, so Zarr verifies each read."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from typing import Any

import zarr
from zarr.abc.codec import BytesBytesCodec
from zarr.codecs import BloscCodec, Crc32cCodec, ZstdCodec

from trak_dist.errors import ConfigError, StoreStateError


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


CODECS = ("none", "zstd", "blosc-lz4", "blosc-zstd")
DEFAULT_CODEC = "none"


def compressors(name: str, checksum: bool = True) -> tuple[BytesBytesCodec, ...] | None:
    """The Zarr v3 bytes-to-bytes chain for ``name`` (one of ``CODECS``), ending in a crc32c
    unless ``checksum`` is False (benchmarks only)."""
    chain: tuple[BytesBytesCodec, ...]
    if name == "none":
        chain = ()
    elif name == "zstd":
        chain = (ZstdCodec(level=1),)
    elif name == "blosc-lz4":
        chain = (BloscCodec(cname="lz4", clevel=5, shuffle="shuffle"),)
    elif name == "blosc-zstd":
        chain = (BloscCodec(cname="zstd", clevel=3, shuffle="shuffle"),)
    else:
        raise ConfigError(f"store codec={name!r}; expected one of {CODECS}.")
    if checksum:
        chain = (*chain, Crc32cCodec())
    return chain or None


CHECKSUM = compressors("none")  # arrays stored uncompressed (Q, row hashes, reductions, scores)
