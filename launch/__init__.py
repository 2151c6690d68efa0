"""Launchers for SLURM (submitit): ``trak-dist-slurm --help``, docs/slurm.md. The package
``trak_dist.launch`` once installed, ``launch`` in a checkout; the only importer of submitit
(docs/design.md, "Import rules")."""

from __future__ import annotations


def main() -> None:
    """The ``trak-dist-slurm`` console entry: :func:`.slurm.main`."""
    # imported here, not at the top: `import trak_dist.launch` stays cheap for whoever only
    # needs the package (the console script imports it to find this function)
    from . import slurm

    raise SystemExit(slurm.main(prog="trak-dist-slurm"))
