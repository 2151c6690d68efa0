"""Launchers for SLURM (submitit): ``python -m launch.slurm --help``. See docs/slurm.md.

This is the only place that imports submitit (DESIGN.md: which way the imports run).
"""
