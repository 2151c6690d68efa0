"""Where a run's time went, per stage: seconds, bytes read and written, and the rates they make
(rows/s and MB/s written while featurising; GB/s read and GFLOP/s while scoring), so a user
sees which stage to scale (docs/design.md, "Pace"). Bytes are what the stage moved through the
store; the score step's FLOPs are its products, 2·n·m·p per checkpoint for the blocks computed
(reused blocks cost nothing), at the stage's wall time and at the blocks' own compute time."""

from __future__ import annotations

import contextlib
import math
from typing import Any

from trak_dist.errors import StoreStateError
from trak_dist.pipeline import JobResult
from trak_dist.store import FeatureStore, RowSet


def _row_bytes(rows: RowSet) -> int:
    """Bytes one example takes in ``rows``: X, its hash, and Q and G where held."""
    return sum(a.dtype.itemsize * math.prod(a.shape[1:]) for a in rows.arrays())


def _rate(amount: float, seconds: float, unit: float, digits: int) -> float:
    """``amount / seconds`` in ``unit``s, rounded; 0 for a stage that took no time."""
    return round(amount / seconds / unit, digits) if seconds else 0.0


def stage_pace(result: JobResult, opened: FeatureStore) -> dict[str, dict[str, float]]:
    """Per stage that moved data, its seconds, bytes and rates (JSON-able, rounded)."""
    out: dict[str, dict[str, float]] = {}
    seconds = result.phases.get("featurize", 0.0)
    per_row = {"train": _row_bytes(opened.train_rows(0)), "target": 0}
    with contextlib.suppress(StoreStateError):  # a run that featurised no targets
        per_row["target"] = _row_bytes(opened.target_rows(result.exp, 0))
    rows = sum(result.rows_computed.values())
    written = sum(n * per_row[k] for k, n in result.rows_computed.items())
    out["featurize"] = {
        "seconds": round(seconds, 3),
        "bytes_written": written,
        "rows_per_s": _rate(rows, seconds, 1.0, 1),
        "mb_per_s_written": _rate(written, seconds, 1e6, 2),
    }
    if result.scores:
        seconds = result.phases.get("score", 0.0)
        read = sum(v.bytes_read for v in result.scores)
        flop = sum(
            2.0
            * result.n
            * result.m
            * v.proj_dim
            * result.checkpoints
            * v.blocks_computed
            / max(v.blocks, 1)
            for v in result.scores
        )
        compute = sum(v.block_seconds for v in result.scores)
        out["score"] = {
            "seconds": round(seconds, 3),
            "bytes_read": read,
            "bytes_written": sum(v.bytes_written for v in result.scores),
            "gb_per_s_read": _rate(read, seconds, 1e9, 3),
            "gflop": round(flop / 1e9, 3),
            "gflop_per_s": _rate(flop, seconds, 1e9, 2),
            "block_gflop_per_s": _rate(flop, compute, 1e9, 2),
        }
    return out


def _size(n: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{int(n)} B"


def pace_table(phases: dict[str, float], pace: dict[str, dict[str, Any]]) -> list[str]:
    """The report's table of phases (Markdown lines): seconds, and for the stages that moved
    data, bytes read and written and their rates."""
    lines = ["| phase | seconds | read | written | rate |", "| --- | ---: | ---: | ---: | --- |"]
    for phase, seconds in phases.items():
        p = pace.get(phase)
        if phase == "featurize" and p:
            cells = (
                "",
                _size(p["bytes_written"]),
                f"{p['rows_per_s']:.4g} rows/s, {p['mb_per_s_written']:.3g} MB/s written",
            )
        elif phase == "score" and p:
            cells = (
                _size(p["bytes_read"]),
                _size(p["bytes_written"]),
                f"{p['gb_per_s_read']:.3g} GB/s read; {p['gflop_per_s']:.3g} GFLOP/s "
                f"({p['block_gflop_per_s']:.3g} in the blocks' own compute time)",
            )
        else:
            cells = ("", "", "")
        lines.append(f"| {phase} | {seconds:.2f} | {' | '.join(cells)} |")
    return lines
