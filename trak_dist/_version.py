"""trak_dist's version: one source, ``[project] version`` in pyproject.toml, read back from the
installed distribution's metadata."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("trak_dist")
except PackageNotFoundError:
    # a source tree on sys.path that was never installed (e.g. the code `ray job submit
    # --working-dir` uploads, on nodes that have only the dependencies)
    __version__ = "0+unknown"
