"""The LDS table (Markdown, CSV, JSON) and plot that ``trak-dist eval`` writes."""

from __future__ import annotations

import csv
import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from trak_dist.lds._scores import VariantLDS

logger = logging.getLogger("trak_dist")
COLUMNS = ("variant", "proj_dim", "lambda_reg", "lambdas", "lds", "low", "high", "models")


def best(rows: Sequence[VariantLDS]) -> VariantLDS | None:
    """The variant with the highest LDS (None when there is none)."""
    ok = [r for r in rows if np.isfinite(r.result.lds)]
    return max(ok, key=lambda r: r.result.lds) if ok else None


def _lambdas(r: VariantLDS) -> str:
    return ", ".join(f"{x:.3g}" for x in r.lambdas)


def to_markdown(rows: Sequence[VariantLDS], exp: str) -> str:
    top = best(rows)
    level = f"{100 * rows[0].result.level:.0f} %" if rows else "95 %"
    lines = [
        f"LDS of experiment {exp!r}: mean Spearman over targets between the scores' predicted "
        f"and the measured outputs of subset models ({level} bootstrap interval over models "
        "and targets)",
        "",
        f"| variant | proj_dim | λ | λ per checkpoint | LDS | {level} interval | models |",
        "| --- | ---: | --- | --- | ---: | --- | ---: |",
    ]
    for r in sorted(rows, key=lambda r: (r.proj_dim, str(r.lambda_reg))):
        mark = " (best)" if r is top else ""
        lines.append(
            f"| {r.variant}{mark} | {r.proj_dim} | {r.lambda_reg} | {_lambdas(r)} | "
            f"{r.result.lds:.3f} | [{r.result.low:.3f}, {r.result.high:.3f}] | "
            f"{r.result.models} |"
        )
    if top is not None:
        lines += ["", f"best: {top.variant}, LDS {top.result}"]
    return "\n".join(lines) + "\n"


def write(
    rows: Sequence[VariantLDS],
    exp: str,
    folder: Path,
    recorded: dict[int, dict[str, Any]] | None = None,
) -> dict[str, Path]:
    """``lds.md``, ``lds.csv``, ``lds.json`` (with the best λ ``recorded`` per proj_dim) and
    (with matplotlib) ``lds.png`` in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    files = {"md": folder / "lds.md", "csv": folder / "lds.csv", "json": folder / "lds.json"}
    files["md"].write_text(to_markdown(rows, exp))
    records = [r.to_json() for r in rows]
    with open(files["csv"], "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=[*COLUMNS, "targets", "level"])
        writer.writeheader()
        for rec in records:
            writer.writerow({**rec, "lambdas": " ".join(map(str, rec["lambdas"]))})
    top = best(rows)
    files["json"].write_text(
        json.dumps(
            {
                "exp": exp,
                "best": top.variant if top else None,
                "variants": records,
                "recorded_best_lambda": {str(p): r for p, r in sorted((recorded or {}).items())},
            },
            indent=2,
        )
    )
    if plot(rows, exp, folder / "lds.png"):
        files["png"] = folder / "lds.png"
    return files


def plot_x(r: VariantLDS) -> float:
    """Where a variant goes on the λ axis: its λ (auto: the mean over checkpoints)."""
    if isinstance(r.lambda_reg, str):
        return float(np.mean(r.lambdas)) if r.lambdas else float("nan")
    return float(r.lambda_reg)


def plot(rows: Sequence[VariantLDS], exp: str, path: Path) -> bool:
    """LDS against λ, a line per proj_dim, ``auto`` as a star; False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        logger.info("matplotlib is not installed (pip install 'trak_dist[plot]'); no LDS plot")
        return False
    xs = [plot_x(r) for r in rows]
    positive = [x for x in xs if np.isfinite(x) and x > 0]
    zero_at = min(positive) / 10 if positive else 1e-6
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for i, p in enumerate(sorted({r.proj_dim for r in rows})):
        color = f"C{i}"
        fixed = sorted(
            ((x if x > 0 else zero_at), r)
            for x, r in zip(xs, rows, strict=True)
            if r.proj_dim == p and not isinstance(r.lambda_reg, str)
        )
        if fixed:
            ax.errorbar(
                [x for x, _ in fixed],
                [r.result.lds for _, r in fixed],
                yerr=_yerr([r for _, r in fixed]),
                marker="o",
                capsize=3,
                color=color,
                label=f"proj_dim={p}",
            )
        for x, r in zip(xs, rows, strict=True):
            if r.proj_dim == p and isinstance(r.lambda_reg, str) and np.isfinite(x):
                ax.errorbar(
                    [x],
                    [r.result.lds],
                    yerr=_yerr([r]),
                    marker="*",
                    markersize=14,
                    capsize=3,
                    color=color,
                    linestyle="none",
                    label=f"proj_dim={p}, λ=auto",
                )
    ax.set_xscale("log")
    zero = f"; 0 drawn at {zero_at:.2g}" if any(x == 0 for x in xs) else ""
    ax.set_xlabel(f"λ (auto: mean over checkpoints{zero})")
    ax.set_ylabel("LDS")
    ax.set_title(f"LDS of {exp!r} ({rows[0].result.models} subset models)" if rows else exp)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def _yerr(rows: Sequence[VariantLDS]) -> Any:
    return np.array(
        [
            [max(0.0, r.result.lds - r.result.low) for r in rows],
            [max(0.0, r.result.high - r.result.lds) for r in rows],
        ]
    )
