"""Launchers for SLURM (submitit): ``trak-dist-slurm --help``. See docs/slurm.md.

This directory is the package ``trak_dist.launch`` once trak_dist is installed (pyproject.toml
maps it), and ``launch`` at a checkout's root. This is the only place that imports submitit
(docs/design.md, "Import rules"); submitit is one of trak_dist's dependencies.
"""

from __future__ import annotations


def main() -> None:
    """The ``trak-dist-slurm`` console entry: :func:`.slurm.main`."""
    # imported here, not at the top: `import trak_dist.launch` stays cheap for whoever only
    # needs the package (the console script imports it to find this function)
    from . import slurm

    raise SystemExit(slurm.main(prog="trak-dist-slurm"))
