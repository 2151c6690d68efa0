"""The CPU dry run's stand-in for a lent GPU machine's image (``device_check.sh --cpu-dry-run``
puts this folder first on PYTHONPATH, so every Python it starts imports this module).

The file named by ``$TRAK_DIST_DEVICE_HIDE`` lists top-level module names, one a line: those of
this venv's distributions that the image lacks (Ray among them; ``benchmarks/device/_hide.py``
writes it). They are invisible in the venv's site-packages: ``import`` fails and
``importlib.util.find_spec`` returns None, as there. The wheel set's target folder, earlier on
PYTHONPATH, is not filtered, so what the set brings imports as it will on the GPU machine."""

from __future__ import annotations

import os
import site
import sys
from importlib.machinery import FileFinder


class _Filtered:
    """A site-packages directory's finder that cannot see the hidden top-level names."""

    def __init__(self, finder: FileFinder, hidden: frozenset[str]) -> None:
        self._finder, self._hidden = finder, hidden

    def find_spec(self, fullname: str, target: object = None) -> object:
        if fullname.partition(".")[0] in self._hidden:
            return None
        return self._finder.find_spec(fullname, target)  # type: ignore[arg-type]

    def invalidate_caches(self) -> None:
        self._finder.invalidate_caches()


def _install(listing: str) -> None:
    with open(listing) as f:
        hidden = frozenset(line.strip() for line in f if line.strip())
    dirs = {os.path.realpath(d) for d in site.getsitepackages()}

    def hook(path: str) -> _Filtered:
        if os.path.realpath(path) not in dirs:
            raise ImportError  # not ours: the next path hook handles it
        for default in sys.path_hooks[1:]:
            try:
                return _Filtered(default(path), hidden)
            except ImportError:
                continue
        raise ImportError

    sys.path_hooks.insert(0, hook)
    for path in list(sys.path_importer_cache):
        if os.path.realpath(path) in dirs:
            del sys.path_importer_cache[path]


if os.environ.get("TRAK_DIST_DEVICE_HIDE"):
    _install(os.environ["TRAK_DIST_DEVICE_HIDE"])
