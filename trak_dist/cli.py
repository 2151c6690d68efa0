"""``trak-dist``: the Hydra app. With no arguments it runs the bundled digits example.

trak-dist                                   # embedded default, local Ray, CPU
trak-dist cluster=ray                       # inside `ray job submit`
trak-dist -m proj_dim=512,1024 lambda_reg=auto,1e-2   # sweep: one featurisation, one
                                                      # factorisation per checkpoint
trak-dist eval                              # LDS of the stored scores (retrains subsets)
trak-dist serve                             # attribution of new targets over HTTP (Ray Serve)
trak-dist --help                            # groups and options
trak-dist --version                         # trak_dist's and the store format's versions
trak-dist build-cuda                        # compile the CUDA kernel for this installation
trak-dist store verify|repair PATH          # check a store's chunks; recompute what is damaged
trak-dist show OVERRIDES [show.json=true]   # targets with their top proponents, as text
"""

from __future__ import annotations

import csv
import json
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from trak_dist import _build_cuda, _eval_cli, explain, failures, serve, store
from trak_dist._compose import conf_dir  # registers the schema; conf_dir is also this module's
from trak_dist._remote_report import publish, run_name
from trak_dist._version import __version__
from trak_dist.config import JobConfig
from trak_dist.errors import TrakDistError

logger = logging.getLogger("trak_dist")


def sweep_width(argv: list[str]) -> list[str]:
    """In a multirun sweeping proj_dim, featurise once at the largest value: append
    ``projection.featurize_dim=max`` (prefix property) unless the command line sets it or a
    value is not a number (``auto``)."""
    if not ({"-m", "--multirun"} & set(argv)):
        return argv
    args = [a for a in argv[1:] if not a.startswith("-")]
    if any(a.split("=")[0].lstrip("+~") == "projection.featurize_dim" for a in args):
        return argv
    try:
        overrides = OverridesParser.create().parse_overrides(args)
    except Exception:  # Hydra reports malformed overrides itself, with context
        return argv
    for o in overrides:
        if o.key_or_group == "proj_dim" and o.is_sweep_override():
            values = list(o.sweep_string_iterator())
            if not all(v.isdigit() for v in values):
                # "auto" is resolved per task later: each point featurises at its own width
                return argv
            width = max(int(v) for v in values)
            return [*argv, f"projection.featurize_dim={width}"]
    return argv


def _run(cfg: DictConfig) -> dict[str, Any]:
    from trak_dist.api import run_config
    from trak_dist.pipeline import resolve_inputs
    from trak_dist.report import report_job, to_markdown

    hc = HydraConfig.get()
    multirun = hc.mode == RunMode.MULTIRUN
    job = OmegaConf.to_object(cfg)
    assert isinstance(job, JobConfig)  # the schema is JobConfig
    job = resolve_inputs(job)  # the report reads the same datasets as the workers
    result = run_config(job, keep_alive=multirun)
    stem = Path(hc.runtime.output_dir) / job.report if job.report else None
    summary = report_job(job, result, stem, {"overrides": list(hc.overrides.task)})
    if stem is not None:
        # a store on object storage gets the report beside it: no shared folder needed
        run = run_name(hc.runtime.output_dir)
        files = [stem.with_suffix(s) for s in (".md", ".json", ".png")]
        urls = publish(files, job.store.path, run, job.store.options)
        summary["report"] = urls[0] if urls else summary["report"]
    print(to_markdown(summary))
    if job.report:
        print(f"report: {summary['report']}")
    return summary


def _task(cfg: DictConfig) -> dict[str, Any]:
    try:
        return _run(cfg)
    except Exception as e:
        # caught here, inside the task: Hydra would print any exception with its traceback
        hc = HydraConfig.get()
        if hc.mode != RunMode.MULTIRUN or not isinstance(failures.unwrap(e), TrakDistError):
            failures.exit_on(e, "trak-dist")  # one line and exit 2, unless it is a bug
            raise
        # in a sweep, one bad point (e.g. λ=0 with proj_dim ≥ n) must not sink the others
        message = failures.describe(e)
        logger.error("sweep point %s failed: %s", list(hc.overrides.task), message)
        failed = {"overrides": list(hc.overrides.task), "error": message}
        Path(hc.runtime.output_dir, "trak_report.json").write_text(json.dumps(failed))
        return failed


class SweepSummary(Callback):
    """After a multirun: ``sweep_summary.{md,csv,png}`` in the sweep directory."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        root = Path(config.hydra.sweep.dir)
        rows = []
        for path in sorted(root.glob("*/trak_report.json"), key=lambda p: p.parent.name):
            rep = json.loads(path.read_text())
            if "error" in rep:
                rows.append(
                    {
                        "job": path.parent.name,
                        "overrides": " ".join(rep["overrides"]),
                        "error": rep["error"].splitlines()[0],
                    }
                )
                continue
            for v in rep["variants"]:
                lds = v.get("lds", {})
                rows.append(
                    {
                        "job": path.parent.name,
                        "proj_dim": v["proj_dim"],
                        "lambda_reg": v["lambda_reg"],
                        "lambdas": " ".join(f"{x:.3g}" for x in v.get("lambdas", [])),
                        "lds": lds.get("lds", ""),
                        "lds_low": lds.get("low", ""),
                        "lds_high": lds.get("high", ""),
                        "label_agreement": v.get("proponent_label_agreement", ""),
                        "total_s": rep["phases_s"]["total"],
                        "featurised_rows": sum(rep["rows_computed"].values()),
                        "score_s": v["seconds"],
                        "error": "",
                    }
                )
        if not rows:
            return
        keys = list(dict.fromkeys(k for r in rows for k in r))
        with open(root / "sweep_summary.csv", "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=keys)
            writer.writeheader()
            writer.writerows(rows)
        table = ["| " + " | ".join(keys) + " |", "|" + " --- |" * len(keys)]
        table += ["| " + " | ".join(str(r.get(k, "")) for k in keys) + " |" for r in rows]
        table += ["", best_point(rows)]
        (root / "sweep_summary.md").write_text("\n".join(table) + "\n")
        _plot(rows, root / "sweep_summary.png")
        print("\n".join(table))
        names = ("sweep_summary.md", "sweep_summary.csv", "sweep_summary.png")
        store = config.get("store") or {}
        where, options = str(store.get("path") or ""), dict(store.get("options") or {})
        urls = publish([root / n for n in names], where, run_name(root), options)
        print(f"sweep summary: {urls[0] if urls else root / 'sweep_summary.md'}")


def best_point(rows: list[dict[str, Any]]) -> str:
    """One line naming the sweep point with the highest LDS (or saying how to get LDS)."""
    scored = [r for r in rows if r.get("lds", "") != ""]
    if not scored:
        return (
            "best point: no LDS measured (run `trak-dist eval` once on this store, then the "
            "sweep again, to rank the points by LDS)."
        )
    top = max(scored, key=lambda r: float(r["lds"]))
    return (
        f"best point (highest LDS): job {top['job']}, proj_dim={top['proj_dim']} "
        f"lambda_reg={top['lambda_reg']}: LDS {float(top['lds']):.3f} "
        f"[{float(top['lds_low']):.3f}, {float(top['lds_high']):.3f}]"
    )


def _plot(rows: list[dict[str, Any]], path: Path) -> None:
    ok = [r for r in rows if not r.get("error")]
    metric = "lds" if any(r.get("lds", "") != "" for r in ok) else "label_agreement"
    ok = [r for r in ok if r.get(metric, "") != ""]
    if not ok:
        return
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        logger.info("matplotlib is not installed (pip install 'trak_dist[plot]'); no sweep plot")
        return

    def x_of(r: dict[str, Any]) -> float:
        if r["lambda_reg"] == "auto":  # drawn at the mean λ it chose
            lams = [float(x) for x in str(r.get("lambdas", "")).split()]
            return sum(lams) / len(lams) if lams else float("nan")
        return max(float(r["lambda_reg"]), 1e-6)

    fig, ax = plt.subplots(figsize=(5, 3.5))
    for i, p in enumerate(sorted({r["proj_dim"] for r in ok})):
        fixed = sorted(
            (x_of(r), float(r[metric]))
            for r in ok
            if r["proj_dim"] == p and r["lambda_reg"] != "auto"
        )
        if fixed:
            ax.plot(*zip(*fixed, strict=True), marker="o", color=f"C{i}", label=f"proj_dim={p}")
        for r in ok:
            if r["proj_dim"] == p and r["lambda_reg"] == "auto":
                ax.plot(x_of(r), float(r[metric]), marker="*", markersize=14, color=f"C{i}")
    ax.set_xscale("log")
    ax.set_xlabel("lambda_reg (0 drawn at 1e-6; ★ auto, at its mean λ)")
    ax.set_ylabel("LDS" if metric == "lds" else "top-k proponents with the target's label")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ``trak-dist <name> …``: every command outside the Hydra job, in this one table; each takes
# the remaining arguments and returns an exit code. Hydra's own argument parser sees everything
# else (overrides, -m, --help).
SUBCOMMANDS: dict[str, Callable[[list[str]], int]] = {
    "build-cuda": _build_cuda.main,
    "eval": _eval_cli.main,
    "serve": serve.main,
    "show": explain.main,
    "store": store.main,
}


def _subcommand(argv: list[str]) -> int | None:
    if len(argv) < 2 or argv[1] not in SUBCOMMANDS:
        return None
    return int(SUBCOMMANDS[argv[1]](argv[2:]))


def version() -> str:
    """``trak-dist --version``: this trak_dist and the store format it writes."""
    from trak_dist.store import FORMAT_VERSION

    return f"trak-dist {__version__} (store format version {FORMAT_VERSION})"


def main() -> None:
    """Console entry point: expected failures end in one line on stderr (exit 2), Ctrl-C in a
    note on how to resume (exit 130)."""
    if sys.argv[1:] in (["--version"], ["-V"]):  # Hydra's own --version names only Hydra's
        print(version())
        return
    # Hydra would print a traceback of a corrupt YAML file or a bad override and exit 1;
    # raised instead, they reach failures.reported and become one line
    os.environ.setdefault("HYDRA_FULL_ERROR", "1")
    with failures.reported("trak-dist"):
        code = _subcommand(sys.argv)
        if code is not None:
            raise SystemExit(code)
        sys.argv = sweep_width(sys.argv)
        # resolved here, not at import: importing the CLI (the launchers do) needs no configs,
        # and a missing or broken config directory is one line instead of a traceback
        config_path = str(conf_dir())
        hydra.main(version_base=None, config_path=config_path, config_name="config")(_task)()
