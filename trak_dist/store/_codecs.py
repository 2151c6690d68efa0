"""Compression codecs for the feature arrays, chosen by name in configs.

The default is "none": projected gradients are dense, near-Gaussian floats and barely compress
(see ``benchmarks/store_codecs.py``: the best lossless codec saves under 10 % at several times
the write cost), so compression would slow every write for little disk saved.
"""

from __future__ import annotations

from zarr.codecs import BloscCodec, ZstdCodec

from trak_dist.errors import ConfigError

CODECS = ("none", "zstd", "blosc-lz4", "blosc-zstd")
DEFAULT_CODEC = "none"


def compressors(name: str) -> tuple[object, ...] | None:
    """The Zarr v3 compressor chain for ``name`` (one of ``CODECS``)."""
    if name == "none":
        return None
    if name == "zstd":
        return (ZstdCodec(level=1),)
    if name == "blosc-lz4":
        return (BloscCodec(cname="lz4", clevel=5, shuffle="shuffle"),)
    if name == "blosc-zstd":
        return (BloscCodec(cname="zstd", clevel=3, shuffle="shuffle"),)
    raise ConfigError(f"store codec={name!r}; expected one of {CODECS}.")
