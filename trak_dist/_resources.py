"""Where the files that ship with trak_dist are: the Hydra configs and the CUDA kernel's sources.

A checkout keeps them at its top level (``conf/``, ``cuda_ext/``); a built distribution maps
them into the package (pyproject.toml's ``package-dir``), so an installed trak_dist finds them
inside itself, a checkout (or ``ray job submit --working-dir`` code) next to itself."""

from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parent


def candidates(name: str) -> list[Path]:
    """The places the shipped directory ``name`` may be, in the order they are tried: inside the
    installed package, then the checkout's top level."""
    return [PACKAGE / name, PACKAGE.parent / name]


def find(name: str, marker: str) -> Path | None:
    """The first of :func:`candidates` holding the file ``marker``, or None."""
    return next((d for d in candidates(name) if (d / marker).is_file()), None)


def cuda_ext_dir() -> Path:
    """The kernel's sources (the directory holding its Makefile); the checkout's ``cuda_ext/``
    when neither place has them, so messages name where a checkout would build."""
    return find("cuda_ext", "Makefile") or candidates("cuda_ext")[-1]
