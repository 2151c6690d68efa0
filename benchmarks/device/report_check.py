"""Checks a GPU check's report is whole: CI runs it on the dry run's (``.ci/run``).

    python -m benchmarks.device.report_check OUTDIR [--dry]

Every section of the check (setup included) is in the sections table with status ``ok`` and has
its heading and something under it; the goals table lists every goal; ``device_check.json``
holds every section. ``--dry`` also wants the dry run's marks: its title, the GPU-only parts
said to be skipped, and ``pytest -m gpu`` with no test failed. Exit 1 with the problems found."""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from benchmarks.device._plan import GOALS, SECTIONS

NAMES = ("setup", *(s[0] for s in SECTIONS))


def problems(md: str, numbers: dict, dry: bool) -> list[str]:
    """What is missing or wrong in a report (``md``) and its numbers (the JSON)."""
    found = []
    status = dict(re.findall(r"^\| (\w+) \| ([^|]+?) \| [\d.]+ \| [\d.]+ \|$", md, re.M))
    for name in NAMES:
        if name not in status:
            found.append(f"section {name} is not in the sections table")
        elif status[name] != "ok":
            found.append(f"section {name}: status {status[name]!r}, expected 'ok'")
        body = re.search(rf"^## {name}: .*?\n(.*?)(?=^## |\Z)", md, re.M | re.S)
        if body is None or not body.group(1).strip() or "(nothing written)" in body.group(1):
            found.append(f"section {name} has no heading or nothing under it")
        if name not in numbers:
            found.append(f"section {name} is not in device_check.json")
    found += [f"goal {what!r} is not in the goals table" for _, _, what, _, _ in GOALS
              if f"| {what} |" not in md]  # fmt: skip
    if "**FAILED**" in md or "**cut short**" in md:
        found.append("the report says FAILED or cut short")
    if dry:
        if "CPU dry run" not in md.splitlines()[0]:
            found.append("the title does not say it is a CPU dry run")
        if not re.search(r"^- skipped: .*needs a CUDA GPU", md, re.M):
            found.append("no GPU-only part is said to be skipped")
        if not re.search(r"pytest -m gpu .*: 0 passed, 0 failed, 0 errors, [1-9]\d* skipped", md):
            found.append("pytest -m gpu did not skip its tests cleanly (or ran none)")
    return found


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--dry", action="store_true")
    args = ap.parse_args(argv)
    md, js = args.out / "device_check.md", args.out / "device_check.json"
    if not md.is_file() or not js.is_file():
        print(f"report_check: error: {md} or {js} is missing", file=sys.stderr)
        return 1
    found = problems(md.read_text(), json.loads(js.read_text()), args.dry)
    for p in found:
        print(f"report_check: error: {p}", file=sys.stderr)
    if not found:
        print(f"report_check: {md} holds all {len(NAMES)} sections and {len(GOALS)} goals")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
