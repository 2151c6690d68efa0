"""Writes the dry run's hidden-module list (``hide/sitecustomize.py``): the top-level import
names of this Python's distributions that the GPU machine's image lacks (``image_packages.txt``),
Ray's among them. What an image distribution needs in this venv stays visible (this venv's
huggingface_hub, say, may need a package the image's older one does not), and so does a name
that an image distribution also provides.

    python -m benchmarks.device._hide OUTFILE

It runs before the wheel set is installed: the standard library and ``packaging`` only."""

from __future__ import annotations

import re
import sys
from importlib.metadata import PackageNotFoundError, packages_distributions, requires
from pathlib import Path

from packaging.requirements import Requirement

IMAGE = Path(__file__).resolve().parent / "image_packages.txt"


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _with_needs(names: set[str]) -> set[str]:
    """``names`` and every distribution they need here, transitively (extras left out)."""
    todo, seen = list(names), set(names)
    while todo:
        try:
            lines = requires(todo.pop()) or []
        except PackageNotFoundError:
            continue
        for line in lines:
            req = Requirement(line)
            if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                continue
            dep = _normal(req.name)
            if dep not in seen:
                seen.add(dep)
                todo.append(dep)
    return seen


def hidden_names() -> list[str]:
    """Top-level names whose every providing distribution the image lacks (with its needs)."""
    lines = IMAGE.read_text().splitlines()
    image = {_normal(s.partition("==")[0]) for s in lines if s.strip() and not s.startswith("#")}
    image = _with_needs(image) | {"trak-dist"}  # the checkout itself, first on PYTHONPATH
    hidden = {
        name
        for name, dists in packages_distributions().items()
        if name.isidentifier() and not any(_normal(d) in image for d in dists)
    }
    hidden.add("ray")
    return sorted(hidden)


if __name__ == "__main__":
    names = hidden_names()
    Path(sys.argv[1]).write_text("\n".join(names) + "\n")
    print(f"hidden: {len(names)} top-level modules the GPU image lacks: {', '.join(names)}")
