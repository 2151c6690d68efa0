"""``trak-dist``: the Hydra app. With no arguments it runs the bundled digits example.

trak-dist                                   # embedded default, local Ray, CPU
trak-dist cluster=ray                       # inside `ray job submit`
trak-dist -m proj_dim=512,1024 lambda_reg=0,1e-2   # sweep: one featurisation, one
                                                   # factorisation per checkpoint
trak-dist --help                            # groups and options
"""

from __future__ import annotations

import csv
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

import hydra
from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from trak_dist.config import JobConfig
from trak_dist.errors import ConfigError, TrakDistError

logger = logging.getLogger("trak_dist")


def _unfreeze(node: Any) -> Any:
    # OmegaConf makes frozen dataclasses read-only, which forbids Hydra's overrides; the frozen
    # class is still what OmegaConf.to_object builds (and validates) at the end.
    OmegaConf.set_readonly(node, False)
    if isinstance(node, DictConfig):
        for key in node:
            child = node._get_node(key)
            if isinstance(child, DictConfig):
                _unfreeze(child)
    return node


ConfigStore.instance().store(
    name="trak_dist_schema", node=_unfreeze(OmegaConf.structured(JobConfig))
)


def conf_dir() -> Path:
    """``$TRAK_DIST_CONF``, else the ``conf/`` of the checkout trak_dist is installed from."""
    env = os.environ.get("TRAK_DIST_CONF")
    path = Path(env) if env else Path(__file__).resolve().parents[1] / "conf"
    if not (path / "config.yaml").is_file():
        raise ConfigError(
            f"trak-dist's Hydra configs were not found at {path}. Install from a checkout "
            "(pip install -e .) or set TRAK_DIST_CONF to a copy of the repository's conf/."
        )
    return path


def sweep_width(argv: list[str]) -> list[str]:
    """In a multirun sweeping proj_dim, featurise once at the largest value: append
    ``projection.featurize_dim=max`` (prefix property) unless the command line sets it."""
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
            width = max(int(v) for v in o.sweep_string_iterator())
            return [*argv, f"projection.featurize_dim={width}"]
    return argv


def _run(cfg: DictConfig) -> dict[str, Any]:
    from trak_dist.distributed.driver import run_job
    from trak_dist.report import summarize, to_markdown, write

    hc = HydraConfig.get()
    multirun = hc.mode == RunMode.MULTIRUN
    job = OmegaConf.to_object(cfg)
    assert isinstance(job, JobConfig)  # the schema is JobConfig
    result = run_job(job, keep_alive=multirun)
    summary = summarize(result, job.data.train, job.data.targets, job.data.kwargs)
    summary["overrides"] = list(hc.overrides.task)
    if job.report:
        md, _ = write(summary, Path(hc.runtime.output_dir) / job.report)
        summary["report"] = str(md)
    print(to_markdown(summary))
    if job.report:
        print(f"report: {summary['report']}")
    return summary


@hydra.main(version_base=None, config_path=str(conf_dir()), config_name="config")
def _app(cfg: DictConfig) -> dict[str, Any]:
    try:
        return _run(cfg)
    except TrakDistError as e:
        hc = HydraConfig.get()
        if hc.mode != RunMode.MULTIRUN:
            print(f"trak-dist: error: {e}", file=sys.stderr)
            raise SystemExit(2) from e
        # in a sweep, one bad point (e.g. λ=0 with proj_dim ≥ n) must not sink the others
        logger.error("sweep point %s failed: %s", list(hc.overrides.task), e)
        failed = {"overrides": list(hc.overrides.task), "error": str(e)}
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
                rows.append(
                    {
                        "job": path.parent.name,
                        "proj_dim": v["proj_dim"],
                        "lambda_reg": v["lambda_reg"],
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
        (root / "sweep_summary.md").write_text("\n".join(table) + "\n")
        _plot(rows, root / "sweep_summary.png")
        print("\n".join(table))
        print(f"sweep summary: {root / 'sweep_summary.md'}")


def _plot(rows: list[dict[str, Any]], path: Path) -> None:
    ok = [r for r in rows if not r.get("error") and r.get("label_agreement") != ""]
    if not ok:
        return
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        logger.info("matplotlib is not installed; skipping the sweep plot")
        return
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for p in sorted({r["proj_dim"] for r in ok}):
        pts = sorted((r["lambda_reg"], r["label_agreement"]) for r in ok if r["proj_dim"] == p)
        xs = [max(x, 1e-6) for x, _ in pts]
        ax.plot(xs, [y for _, y in pts], marker="o", label=f"proj_dim={p}")
    ax.set_xscale("log")
    ax.set_xlabel("lambda_reg (0 drawn at 1e-6)")
    ax.set_ylabel("top-k proponents with the target's label")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ``trak-dist <name> …``: commands outside the Hydra job, each "module:function" taking the
# remaining arguments and returning an exit code. Hydra's own argument parser sees everything
# else (overrides, -m, --help).
SUBCOMMANDS: dict[str, str] = {
    "store": "trak_dist.store._cli:main",
}


def _subcommand(argv: list[str]) -> int | None:
    if len(argv) < 2 or argv[1] not in SUBCOMMANDS:
        return None
    import importlib

    module, _, name = SUBCOMMANDS[argv[1]].partition(":")
    return int(getattr(importlib.import_module(module), name)(argv[2:]))


def main() -> None:
    """Console entry point."""
    code = _subcommand(sys.argv)
    if code is not None:
        raise SystemExit(code)
    sys.argv = sweep_width(sys.argv)
    _app()
