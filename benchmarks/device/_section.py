"""What every section of the GPU check shares: its arguments, its report fragment (written line
by line, so a section killed at its budget leaves what it measured), its numbers, its clock.

A section module's ``main`` builds a ``Section`` from its arguments (the driver passes
``--mode``, ``--md``, ``--json``, ``--state`` and ``--deadline``), writes markdown to it and
records numbers; ``Section.done()`` is its exit code (1 when a check failed)."""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch


class Section:
    """One section's report fragment, numbers and time left.

    Attributes:
        gpu: True on a GPU machine, False in the CPU dry run (tiny sizes, GPU parts skipped).
        device: ``cuda`` or ``cpu``.
        state: numbers recorded by the sections before this one (e.g. the measured peak).
    """

    def __init__(self, argv: Sequence[str] | None = None) -> None:
        ap = argparse.ArgumentParser()
        ap.add_argument("--mode", choices=["gpu", "dry"], required=True)
        ap.add_argument("--md", type=Path, required=True)
        ap.add_argument("--json", type=Path, required=True)
        ap.add_argument("--state", type=Path, default=None)
        ap.add_argument("--deadline", type=float, default=float("inf"), help="epoch seconds")
        args = ap.parse_args(argv)
        self.gpu = args.mode == "gpu"
        self.device = "cuda" if self.gpu else "cpu"
        self.deadline = args.deadline
        self._md, self._json = args.md, args.json
        self.state: dict[str, Any] = {}
        if args.state is not None and args.state.is_file():
            self.state = json.loads(args.state.read_text())
        self.numbers: dict[str, Any] = {}
        self.failed = False
        self._in_table = False
        self._md.write_text("")
        if self.gpu and not torch.cuda.is_available():
            self.fail("torch sees no CUDA GPU (torch.cuda.is_available() is False)")

    def left(self) -> float:
        """Seconds left before this section's budget runs out."""
        return self.deadline - time.time()

    def write(self, text: str = "") -> None:
        """Append ``text`` (a line) to the fragment and print it (a blank line first when it
        follows a table)."""
        if self._in_table and not text.startswith("|"):
            self._in_table = False
            if text:
                self.write()
        self._in_table = text.startswith("|")
        with self._md.open("a") as f:
            f.write(text + "\n")
        print(text, flush=True)

    def table(self, headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
        """A markdown table (floats to 3 significant digits), after a blank line."""
        self.write()
        self.write("| " + " | ".join(headers) + " |")
        self.write("|" + " --- |" * len(headers))
        for row in rows:
            self.row(row)

    def row(self, row: Sequence[Any]) -> None:
        """One more table row, written at once (a row measured is a row kept)."""
        self.write("| " + " | ".join(_fmt(v) for v in row) + " |")

    def skip(self, what: str, why: str) -> None:
        self.write(f"- skipped: {what}: {why}")

    def fail(self, what: str) -> None:
        """A check failed: said in the report, and the section exits 1."""
        self.failed = True
        self.write(f"- **FAILED**: {what}")

    def record(self, key: str, value: Any) -> None:
        """A number for the summary and the JSON (written at once)."""
        self.numbers[key] = value
        self._json.write_text(json.dumps(self.numbers, indent=1, default=str))

    def out_of_time(self, what: str, need_s: float = 0.0) -> bool:
        """True (and says so) when less than ``need_s`` seconds are left for ``what``."""
        if self.left() > need_s:
            return False
        self.write(f"- not measured: {what}: the section's budget ran out")
        return True

    def done(self) -> int:
        self._json.write_text(json.dumps(self.numbers, indent=1, default=str))
        return 1 if self.failed else 0


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3g}"
    return str(v)


def sync(device: torch.device | str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def seconds_per_call(
    fn: Callable[[], Any], device: torch.device | str, min_s: float = 0.3, max_reps: int = 20
) -> float:
    """Seconds per call of ``fn`` after one warm-up call: CUDA events on a GPU (the calls queue
    on the current stream), the wall clock on a CPU; repeated for about ``min_s`` (0: the first
    timed call alone, for calls of seconds)."""
    cuda = torch.device(device).type == "cuda"
    fn()
    sync(device)
    if cuda:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        once = start.elapsed_time(end) / 1e3
    else:
        t0 = time.perf_counter()
        fn()
        once = time.perf_counter() - t0
    if min_s <= 0:
        return once
    reps = max(1, min(max_reps, int(min_s / max(once, 1e-6))))
    if cuda:
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / reps
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t0) / reps
