"""The GPU check's tooling (``benchmarks/device``, issue 28) that CI relies on: the report check
``.ci/run`` runs on the dry run's report accepts a whole report and names what a broken one
lacks; the wheel set's closure check names a requirement the set and the image leave unmet."""

from __future__ import annotations

import dataclasses
import zipfile
from pathlib import Path

from benchmarks.device import wheels
from benchmarks.device._driver import Outcome
from benchmarks.device._plan import SECTIONS
from benchmarks.device._render import render
from benchmarks.device.report_check import problems

PYTEST_LINE = "- `pytest -m gpu tests/a.py` (exit 0, 3 s): 0 passed, 0 failed, 0 errors, 5 skipped"


def outcomes() -> list[Outcome]:
    """A dry run's outcomes: every section ok, GPU parts skipped, the gpu tests skipped."""
    out = [Outcome("setup", "Setup", "ok", 1.0, 2.0, "- installed the wheels", {"nvcc": "13"})]
    for name, title, _, _ in SECTIONS:
        md = PYTEST_LINE if name == "pytest" else "- skipped: the kernel: needs a CUDA GPU"
        out.append(Outcome(name, title, "ok", 1.0, 2.0, md, {"seconds": 1.0}))
    return out


def check(outs: list[Outcome], mode: str = "dry") -> list[str]:
    report = render(mode, "", outs, 10.0, 420.0, "abc1234")
    return problems(report, {o.name: o.numbers for o in outs}, dry=True)


def test_a_whole_dry_run_report_passes():
    assert check(outcomes()) == []


def test_a_missing_failed_or_empty_section_is_named():
    outs = outcomes()
    names = [o.name for o in outs]
    del outs[names.index("featurize")]
    outs[names.index("kernel")] = dataclasses.replace(outs[names.index("kernel")], status="FAILED")
    outs[-1] = dataclasses.replace(outs[-1], markdown="")  # scoring, the last
    found = check(outs)
    assert "section featurize is not in the sections table" in found
    assert "section kernel: status 'FAILED', expected 'ok'" in found
    assert "section scoring has no heading or nothing under it" in found


def test_cut_short_failed_tests_and_a_gpu_report_are_refused():
    outs = outcomes()
    outs[1] = dataclasses.replace(outs[1], markdown="- **cut short**: killed at its budget")
    pytest_at = [o.name for o in outs].index("pytest")
    line = PYTEST_LINE.replace("0 failed", "2 failed")
    outs[pytest_at] = dataclasses.replace(outs[pytest_at], markdown=line)
    found = check(outs)
    assert "the report says FAILED or cut short" in found
    assert any("pytest -m gpu" in p for p in found)
    assert "the title does not say it is a CPU dry run" in check(outcomes(), mode="gpu")


def wheel(folder: Path, name: str, version: str, *requires: str) -> Path:
    path = folder / f"{name}-{version}-py3-none-any.whl"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    meta += "".join(f"Requires-Dist: {r}\n" for r in requires)
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(f"{name}-{version}.dist-info/METADATA", meta)
    return path


def test_the_wheel_set_keeps_what_the_image_lacks_and_must_be_closed(tmp_path):
    resolved = tmp_path / "resolved"
    resolved.mkdir()
    wheel(resolved, "zarr", "3.1.6", "numpy>=1.26", "donfig>=0.8", "pytest; extra == 'test'")
    wheel(resolved, "donfig", "0.8.1", "pyyaml")
    wheel(resolved, "numpy", "2.5.5")  # the image has numpy 2.5.2: not carried
    assert wheels.select(resolved, tmp_path / "set", "3.12") == []
    assert wheels.listing(tmp_path / "set") == {"zarr": "3.1.6", "donfig": "0.8.1"}

    wheel(resolved, "numcodecs", "0.16.6", "numpy>=3", "crc32c; python_version >= '3.12'")
    found = wheels.select(resolved, tmp_path / "set2", "3.12")
    assert found == [
        "numcodecs needs numpy>=3; the set or the image has numpy 2.5.2",
        'numcodecs needs crc32c; python_version >= "3.12", which neither the set nor the image has',
    ]
    # the marker is false for 3.11: only the numpy bound is left
    assert len(wheels.select(resolved, tmp_path / "set3", "3.11")) == 1
