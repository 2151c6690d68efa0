"""Compression codecs for the feature arrays, chosen by name, and the checksum every chunk carries.

Default "none": projected gradients barely compress (under 10 % at several times the write
cost, ``benchmarks/store_codecs.py``). A crc32c ends every chain, so Zarr verifies each read."""

from __future__ import annotations

from zarr.abc.codec import BytesBytesCodec
from zarr.codecs import BloscCodec, Crc32cCodec, ZstdCodec

from trak_dist.errors import ConfigError

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
