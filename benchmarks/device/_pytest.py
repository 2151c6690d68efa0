"""The ``pytest`` section: every test marked ``gpu`` (the kernel's tests, the in-process
pipeline on cuda), run as CI runs pytest (pyproject's options: warnings are errors), its counts
and failures put into the report from pytest's JUnit XML."""

from __future__ import annotations

import json
import time
import xml.etree.ElementTree as ET
from importlib.metadata import entry_points
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from benchmarks.device._driver import Check

from benchmarks.device._driver import ROOT


def gpu_test_files() -> list[str]:
    """Test modules that hold a ``gpu`` test (collecting others would import Ray)."""
    tests = sorted((ROOT / "tests").rglob("test_*.py"))
    return [str(p.relative_to(ROOT)) for p in tests if "pytest.mark.gpu" in p.read_text()]


def hidden_plugins(check: Check) -> list[str]:
    """``-p no:NAME`` for the pytest plugins of hidden distributions (the dry run): pytest finds
    plugins through distribution metadata, which hiding their modules does not remove."""
    if check.mode != "dry":
        return []
    hidden = set(check.hide.read_text().split())
    off = []
    for ep in entry_points(group="pytest11"):
        root = ep.value.split(":")[0].split(".")[0]
        if root in hidden and not (check.site / root).exists():
            off += ["-p", f"no:{ep.name}"]
    return off


def run(check: Check, md: Path, js: Path, budget: float) -> int:
    files = gpu_test_files()
    xml = check.work / "pytest.xml"
    cmd = [
        check.py,
        "-m",
        "pytest",
        "-m",
        "gpu",
        "-q",
        "-rfEs",
        "-p",
        "no:cacheprovider",
        *hidden_plugins(check),
        f"--junitxml={xml}",
        *files,
    ]
    start = time.time()
    code = check.run(cmd, budget - 2)
    seconds = time.time() - start
    lines = [f"- `pytest -m gpu {' '.join(files)}` (exit {code}, {seconds:.0f} s)"]
    numbers: dict[str, object] = {"exit": code}
    if xml.exists():
        counts, failures, skips = _read(xml)
        numbers.update(counts)
        lines[0] += ": " + ", ".join(f"{v} {k}" for k, v in counts.items())
        for name, message in failures:
            lines.append(f"- **FAILED** `{name}`: {message}")
        for reason, n in sorted(skips.items()):
            lines.append(f"- skipped ({n}): {reason}")
        if counts["passed"] + counts["failed"] + counts["errors"] + counts["skipped"] == 0:
            lines.append("- **FAILED**: no gpu test was collected")
            code = code or 5
    else:
        lines.append("- no JUnit report: pytest did not finish (see the log)")
    md.write_text("\n".join(lines) + "\n")
    js.write_text(json.dumps(numbers))
    return code


def _read(xml: Path) -> tuple[dict[str, int], list[tuple[str, str]], dict[str, int]]:
    """Counts, (test, first line of its failure) and skip reasons from a JUnit XML."""
    counts = dict.fromkeys(("passed", "failed", "errors", "skipped"), 0)
    failures: list[tuple[str, str]] = []
    skips: dict[str, int] = {}
    for case in ET.parse(xml).getroot().iter("testcase"):
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        outcome = next((c for c in case if c.tag in ("failure", "error", "skipped")), None)
        tag = outcome.tag if outcome is not None else "passed"
        if tag in ("failure", "error"):
            counts["failed" if tag == "failure" else "errors"] += 1
            message = (outcome.get("message") or outcome.text or "").strip().splitlines()
            failures.append((name, (message[0] if message else "")[:200]))
        elif tag == "skipped":
            counts["skipped"] += 1
            reason = (outcome.get("message") or "").strip()[:200]
            skips[reason] = skips.get(reason, 0) + 1
        else:
            counts["passed"] += 1
    return counts, failures, skips
