"""The GPU check's report: a header, the sections table, the goals table, each section's
fragment (``benchmarks/device/report_check.py`` checks this structure)."""

from __future__ import annotations

from datetime import datetime, timezone

from benchmarks.device._driver import Outcome
from benchmarks.device._plan import GOALS


def render(
    mode: str, only: str, outcomes: list[Outcome], seconds: float, total: float, commit: str
) -> str:
    """The markdown report of a run in ``mode`` (``gpu``/``dry``; ``only``: its --only, or "")."""
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    device = next((o.numbers["device"] for o in outcomes if "device" in o.numbers), "unknown")
    cmd = "bash benchmarks/device_check.sh" + (" --cpu-dry-run" if mode == "dry" else "")
    cmd += f" --only {only}" if only else ""
    title = " — CPU dry run (tiny sizes; no GPU numbers)" if mode == "dry" else ""
    lines = [
        f"# trak_dist GPU check{title}",
        "",
        f"- when: {when}; device: {device}",
        f"- command: `{cmd} OUTDIR` ({seconds:.0f} s of a {total:.0f} s budget); checkout: "
        f"{commit}",
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
        if mode == "dry" and met:
            met = "(dry run: tiny sizes)"
        limit = "(reported)" if bound is None else f"{op} {bound}"
        lines.append(f"| {what} | {limit} | {shown} | {met} |")
    for o in outcomes:
        lines += ["", f"## {o.name}: {o.title}", "", o.markdown.rstrip() or "(nothing written)"]
    return "\n".join(lines) + "\n"


def _holds(value: float, op: str, bound: float) -> bool:
    return {">=": value >= bound, "<=": value <= bound, "==": value == bound}[op]
