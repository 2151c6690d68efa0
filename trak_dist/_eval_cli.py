"""``trak-dist eval [overrides]``: the LDS of the store's scores (``trak_dist.evaluation``), with
``trak-dist``'s overrides plus ``eval.*``, e.g. ``trak-dist eval eval.num_models=200``."""

from __future__ import annotations

import time
from pathlib import Path

USAGE = """usage: trak-dist eval [OVERRIDE ...]

The linear datamodeling score (LDS) of every score set in the store: trains eval.num_models
models on random eval.alpha-subsets of the train set with eval.recipe (Ray tasks), stores each
one's target outputs as it finishes (a killed eval resumes), and prints the LDS of every scored
variant with a bootstrap interval. Writes lds.{md,csv,json,png} to eval.output_dir (default
outputs/eval/<date>/<time>).

Overrides are trak-dist's (store.path, model.*, data.*, task.*, scoring.exp_name, cluster=...)
plus eval.recipe, eval.recipe_kwargs, eval.num_models (100), eval.alpha (0.5), eval.seed,
eval.bootstrap, eval.cpus_per_model, eval.gpus_per_model, eval.overwrite, and eval.lambdas: λ
to score at proj_dim from the stored features first (no refeaturisation; numbers, auto, and
grid: 10^-3 … 10 × the auto λ). The best λ per proj_dim is recorded in the store, and
`trak-dist lambda_reg=best` (or serve, explain) uses it.

  trak-dist eval                                   # the digits example, after `trak-dist`
  trak-dist eval eval.num_models=200
  trak-dist eval 'eval.lambdas=[grid]'             # a λ sweep, then: trak-dist lambda_reg=best
  trak-dist eval model=custom data=custom model.factory=pkg.m:make ... eval.recipe=pkg.m:train
"""


RESUME = "the finished subset models are kept: rerun the same command to train the rest"


def main(argv: list[str]) -> int:
    """Entry point of the subcommand; returns the exit code."""
    if {"-h", "--help"} & set(argv):
        print(USAGE)
        return 0
    from trak_dist import failures

    # as for `trak-dist`: an expected failure (raised inside a Ray task too, an OSError, a
    # corrupt file) is one line and exit 2, Ctrl-C exit 130 with how to resume
    try:
        with failures.reported("trak-dist eval", RESUME):
            # imported here: `trak-dist eval --help` needs neither Hydra nor torch
            from trak_dist._compose import compose_job
            from trak_dist.evaluation import evaluate_config

            cfg = compose_job(argv)
            out = Path(cfg.eval.output_dir or time.strftime("outputs/eval/%Y-%m-%d/%H-%M-%S"))
            ev = evaluate_config(cfg, out)
    except SystemExit as e:
        return int(e.code or 0)
    run = ev.run
    print(
        f"subset models: {run.trained} trained, {run.reused} reused from the store "
        f"({run.seconds:.1f} s)"
    )
    if ev.scored:
        print(f"scored from the stored features for eval.lambdas: {', '.join(ev.scored)}")
    print(ev.to_markdown())
    for p, rec in sorted(ev.recorded.items()):
        print(
            f"recorded for lambda_reg=best at proj_dim={p}: λ={rec['lambda_reg']} "
            f"({rec['variant']}, LDS {rec['lds']:.3f} [{rec['low']:.3f}, {rec['high']:.3f}], "
            f"best of {len(rec['candidates'])})"
        )
    plot = f"; plot: {ev.files['png']}" if "png" in ev.files else ""
    print(f"tables: {ev.files['md']}, {ev.files['csv']}{plot}")
    return 0
