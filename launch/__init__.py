"""Launchers for SLURM (submitit): ``trak-dist-slurm --help``. See docs/slurm.md.

This directory is the package ``trak_dist.launch`` once trak_dist is installed (pyproject.toml
maps it), and ``launch`` at a checkout's root. This is the only place that imports submitit
(DESIGN.md: which way the imports run).
"""

from __future__ import annotations

import sys


def main() -> None:
    """The ``trak-dist-slurm`` console entry: :func:`.slurm.main`, after checking that the
    optional ``slurm`` extra (submitit) is installed."""
    prog = "trak-dist-slurm"
    try:
        from . import slurm
    except ModuleNotFoundError as e:
        if e.name != "submitit":
            raise
        print(
            f"{prog}: error: submitit is not installed; the SLURM launchers need trak_dist's "
            "slurm extra: pip install 'trak_dist[slurm]'",
            file=sys.stderr,
        )
        raise SystemExit(2) from None
    raise SystemExit(slurm.main(prog=prog))
