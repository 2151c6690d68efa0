"""Benchmarks: each module runs with one command and prints a table (``python -m benchmarks``
runs the CPU ones). Numbers worth quoting are ratios measured side by side in one run."""
