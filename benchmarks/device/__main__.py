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
from datetime import datetime, timezone
from pathlib import Path

from benchmarks.device import _driver
from benchmarks.device._driver import ROOT, Check, Outcome

# (name, title, budget on a GPU machine in s, budget in the dry run in s)
SECTIONS = (
    ("env", "Machine, versions, and the dense bf16 peak", 20, 30),
    ("kernel", "Kernel correctness against the torch reference", 35, 30),
    ("pytest", "`pytest -m gpu`: the kernel's tests and the in-process pipeline on cuda", 100, 60),
    ("pipeline", "The in-process pipeline on the GPU against the same job on the CPU", 35, 60),
    ("projection", "Projection throughput: our kernel vs torch dense vs fast_jl", 110, 30),
    ("featurize", "Featurising a GPT-2-small-size LM (124M, bf16) vs a training step", 60, 40),
    ("scoring", "Scoring n = 1M × m = 10k at p = 4096 vs a plain torch.mm", 70, 30),
)
SETUP_BUDGET = {"gpu": 45, "dry": 120}
TOTAL_S = {"gpu": 470, "dry": 420}
# goals of issue 28, read from the sections' numbers: (section, key, what, comparison, bound)
GOALS = (
    ("kernel", "all_match", "kernel matches the reference (signs bit for bit, products)", "==", 1),
    ("projection", "vs_fast_jl_min_b128", "kernel ÷ fast_jl throughput, min at B = 128", ">=", 3),
    (
        "projection",
        "peak_frac_min_b128",
        "kernel's share of the measured bf16 peak, min at B = 128",
        ">=",
        0.5,
    ),
    ("featurize", "kronecker_x_train", "Kronecker featurisation ÷ one training step", "<=", 3),
    ("scoring", "score_vs_mm", "scoring rate ÷ torch.mm rate of the same shapes", "", None),
)


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
    outcomes: list[Outcome] = [check.setup(started + SETUP_BUDGET[mode])]
    state: dict[str, dict] = {"setup": check.numbers}
    if outcomes[0].status == "ok":
        for name, title, gpu_s, dry_s in SECTIONS:
            if name not in args.only.split(","):
                continue
            budget = min(gpu_s if mode == "gpu" else dry_s, started + total - time.time())
            if budget < 5:
                outcomes.append(Outcome(name, title, "not run", 0.0, 0.0, "", {}))
                continue
            if name == "projection":
                check.wait_fast_jl()
            outcome = check.section(name, title, budget, state)
            state[name] = outcome.numbers
            outcomes.append(outcome)
    check.stop_fast_jl()
    report = _report(mode, args, outcomes, check, time.time() - started, total)
    (args.out / "device_check.md").write_text(report)
    (args.out / "device_check.json").write_text(json.dumps(state, indent=1, default=str))
    check.say(f"report: {args.out / 'device_check.md'} ({time.time() - started:.0f} s)")
    shutil.rmtree(work, ignore_errors=True)
    return 0 if all(o.status in ("ok", "skipped") for o in outcomes) else 1


def _report(
    mode: str,
    args: argparse.Namespace,
    outcomes: list[Outcome],
    check: Check,
    seconds: float,
    total: float,
) -> str:
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    device = next((o.numbers["device"] for o in outcomes if "device" in o.numbers), "unknown")
    cmd = "bash benchmarks/device_check.sh" + (" --cpu-dry-run" if mode == "dry" else "")
    if args.only != ",".join(s[0] for s in SECTIONS):
        cmd += f" --only {args.only}"
    title = " — CPU dry run (tiny sizes; no GPU numbers)" if mode == "dry" else ""
    lines = [
        f"# trak_dist GPU check{title}",
        "",
        f"- when: {when}; device: {device}",
        f"- command: `{cmd} OUTDIR` ({seconds:.0f} s of a {total:.0f} s budget); checkout: "
        f"{_driver.commit()}",
        "",
        "| section | status | seconds | budget s |",
        "| --- | --- | --- | --- |",
    ]
    lines += [f"| {o.name} | {o.status} | {o.seconds:.0f} | {o.budget:.0f} |" for o in outcomes]
    lines += ["", "## Goals", "", "| goal | bound | measured | met |", "| --- | --- | --- | --- |"]
    found = {o.name: o.numbers for o in outcomes}
    for section, key, what, op, bound in GOALS:
        value = found.get(section, {}).get(key)
        shown = "not measured" if value is None else f"{value:.3g}"
        met = "" if value is None or bound is None else "yes" if _holds(value, op, bound) else "NO"
        limit = "(reported)" if bound is None else f"{op} {bound}"
        lines.append(f"| {what} | {limit} | {shown} | {met} |")
    for o in outcomes:
        lines += ["", f"## {o.name}: {o.title}", "", o.markdown.rstrip() or "(nothing written)"]
    return "\n".join(lines) + "\n"


def _holds(value: float, op: str, bound: float) -> bool:
    return {">=": value >= bound, "<=": value <= bound, "==": value == bound}[op]


if __name__ == "__main__":
    os.chdir(ROOT)
    sys.exit(main())
