"""The GPU check: every GPU path of trak_dist in one command, a markdown report at the end.

    bash benchmarks/device_check.sh OUTDIR                  # on a lent GPU machine
    bash benchmarks/device_check.sh --cpu-dry-run OUTDIR    # here: tiny sizes, GPU parts skipped
    ... --only kernel,projection                            # a rerun of some sections

Setup (this process, standard library only): the wheel set (``make device-wheels``) is installed
into a fresh target folder with ``--no-index``; the kernel is built with nvcc for the GPU
present; traker's fast_jl is built from its sdist in the background (at most 2 minutes). Then
each section runs in a process of its own, killed at its time budget (what it wrote stays in
the report, marked cut short), and the whole check stops at ``--total-s``. The report
(``OUTDIR/device_check.md``), every number (``.json``) and the full output (``.log``) are the
only files written to OUTDIR (the device tool brings back at most 8).

The dry run runs the same code as the GPU machine would, in an environment made to look like
its image: the wheel set's twin for this Python installed the same way, Ray and every
distribution the image lacks hidden (``hide/sitecustomize.py``); it also checks that the 3.12
set itself installs with ``--no-index``."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.device import _driver
from benchmarks.device._driver import ROOT, Check, Outcome
from benchmarks.device._plan import SECTIONS, SETUP_BUDGET, TOTAL_S
from benchmarks.device._render import render


def _parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="device_check.sh", description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path, help="folder for device_check.md/.json/.log")
    ap.add_argument("--cpu-dry-run", action="store_true", help="tiny sizes on this CPU")
    names = [s[0] for s in SECTIONS]
    ap.add_argument("--only", default=",".join(names), help=f"comma-separated: {names}")
    ap.add_argument("--total-s", type=float, default=None, help="the whole check's budget")
    args = ap.parse_args(argv)
    unknown = set(args.only.split(",")) - set(names)
    if unknown:
        ap.error(f"--only: unknown sections {sorted(unknown)}; known: {names}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    mode = "dry" if args.cpu_dry_run else "gpu"
    started = time.time()
    total = args.total_s or TOTAL_S[mode]
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="trak_device_"))
    check = Check(mode, work, args.out / "device_check.log")
    check.say(f"# trak_dist GPU check ({'CPU dry run' if mode == 'dry' else 'GPU'}), work {work}")
    only = "" if args.only == ",".join(s[0] for s in SECTIONS) else args.only
    outcomes: list[Outcome] = []
    state: dict[str, dict] = {"setup": check.numbers}

    def write_report() -> None:
        """The report so far: a run killed from outside still leaves what it measured."""
        seconds = time.time() - started
        report = render(mode, only, outcomes, seconds, total, _driver.commit())
        (args.out / "device_check.md").write_text(report)
        (args.out / "device_check.json").write_text(json.dumps(state, indent=1, default=str))

    outcomes.append(check.setup(started + SETUP_BUDGET[mode]))
    write_report()
    if outcomes[0].status == "ok":
        for name, title, gpu_s, dry_s in SECTIONS:
            if name not in args.only.split(","):
                continue
            if name == "projection":
                check.wait_fast_jl()
            budget = min(gpu_s if mode == "gpu" else dry_s, started + total - time.time())
            if budget < 5:
                outcomes.append(Outcome(name, title, "not run", 0.0, 0.0, "", {}))
                continue
            outcome = check.section(name, title, budget, state)
            state[name] = outcome.numbers
            outcomes.append(outcome)
            write_report()
    check.stop_fast_jl()
    write_report()
    check.say(f"report: {args.out / 'device_check.md'} ({time.time() - started:.0f} s)")
    shutil.rmtree(work, ignore_errors=True)
    return 0 if all(o.status in ("ok", "skipped") for o in outcomes) else 1


if __name__ == "__main__":
    os.chdir(ROOT)
    sys.exit(main())
