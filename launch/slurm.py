"""Run trak-dist on SLURM through submitit, in one of two modes.

    trak-dist-slurm ray   --nodes 4 --gpus-per-node 1 --partition gpu -- proj_dim=2048
    trak-dist-slurm array --tasks 16 --partition cpu -- proj_dim=2048 lambda_reg=1e-2
    trak-dist-slurm ray --eval --nodes 4 --partition cpu -- eval.num_models=200

``ray``: one allocation of N nodes running a Ray cluster, the driver on the head (``--eval``:
``trak-dist eval``'s driver). ``array``: K array tasks featurise shards with the plain Worker
(requeued on preemption, skipping committed chunks), a dependent job reduces and prepares the
scoring, ``--score-tasks`` array tasks score its blocks, and a last job merges them.
Trailing arguments are Hydra overrides; ``--local`` uses submitit's local executor."""

from __future__ import annotations

import argparse
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import submitit

from trak_dist import failures
from trak_dist._compose import compose_job
from trak_dist.config import JobConfig
from trak_dist.errors import ConfigError, WorkerFailedError
from trak_dist.pipeline import Prepared, prepare, resolve_inputs
from trak_dist.scoring import ScorePlan
from trak_dist.store import store_lock

# relative: this package is `launch` in a checkout and `trak_dist.launch` once installed
from ._array import ScoreRunner, ShardRunner, merge_and_report, reduce_and_prepare, split
from ._ray_cluster import Drive, RayClusterJob, evaluate_and_report


def executor(
    folder: Path, local: bool, partition: str | None, timeout_min: int, mem_gb: float, **params: Any
) -> submitit.Executor:
    if not local and shutil.which("sbatch") is None:
        raise ConfigError(
            "sbatch was not found: this machine is not a SLURM submit host. Run on one, or pass "
            "--local to use submitit's local executor."
        )
    ex = submitit.AutoExecutor(folder=folder, cluster="local" if local else None)
    ex.update_parameters(timeout_min=timeout_min, mem_gb=mem_gb, name="trak-dist", **params)
    if partition and not local:
        ex.update_parameters(slurm_partition=partition)
    return ex


def submit_ray(
    cfg: JobConfig,
    folder: Path,
    nodes: int = 1,
    cpus_per_node: int = 2,
    gpus_per_node: int = 0,
    mem_gb: float = 8,
    timeout_min: int = 60,
    partition: str | None = None,
    port: int = 6379,
    head_ip: str | None = None,
    local: bool = False,
    drive: Drive | None = None,
) -> submitit.Job[Any]:
    """One job of ``nodes`` tasks (one per node) running RayClusterJob (``drive``: what the
    head runs, default the job and its report)."""
    ex = executor(
        folder,
        local,
        partition,
        timeout_min,
        mem_gb,
        nodes=nodes,
        tasks_per_node=1,
        cpus_per_task=cpus_per_node,
        gpus_per_node=gpus_per_node,
    )
    job = RayClusterJob(cfg, port, head_ip, cpus_per_node, gpus_per_node, folder / "report", drive)
    return ex.submit(job)


@dataclass(frozen=True)
class ArrayJobs:
    """The jobs of one array launch, in the order they run: shard tasks, the reduce job
    (``StagedScoring``), score tasks (their ``BlockResult`` lists), the merge job (the
    report's summary)."""

    shards: list[submitit.Job[Any]]
    reduce: submitit.Job[Any]
    scores: list[submitit.Job[Any]]
    merge: submitit.Job[Any]


def _after(ex: submitit.Executor, jobs: list[submitit.Job[Any]], local: bool) -> None:
    """Make the next submission wait for ``jobs`` to succeed."""
    if local:
        for j in jobs:  # the local executor has no dependencies: wait here instead
            j.result()
        return
    ids = sorted({j.job_id.split("_")[0] for j in jobs})  # an array's tasks share its id
    # kill-on-invalid-dep: a cancelled or failed task cancels what waits for it, which would
    # otherwise stay pending for ever (and `--wait` with it)
    extra = {"dependency": "afterok:" + ":".join(ids), "kill_on_invalid_dep": "yes"} if ids else {}
    ex.update_parameters(slurm_additional_parameters=extra)


def score_blocks(cfg: JobConfig, prep: Prepared) -> int:
    """How many score blocks the job's scoring has (its plan; the sizes only)."""
    spec, m = prep.store.spec, prep.store.num_targets(cfg.scoring.exp_name)
    c = len(prep.checkpoints)
    plan = ScorePlan.of(spec.train_size, m, prep.proj_dim, c, cfg.scoring, spec.chunk_rows)
    return len(plan.row_ranges) * len(plan.super_blocks)


def submit_array(
    cfg: JobConfig,
    folder: Path,
    tasks: int = 4,
    cpus_per_task: int = 1,
    gpus_per_task: int = 0,
    mem_gb: float = 4,
    timeout_min: int = 60,
    partition: str | None = None,
    local: bool = False,
    score_tasks: int | None = None,
) -> ArrayJobs:
    """The array of shard runners, the dependent reduce job, the array of ``score_tasks``
    score runners (default ``tasks``; at most one per block) and the merge job."""
    cfg = resolve_inputs(cfg)  # idempotent; the tasks get absolute paths and model=hf resolved
    with store_lock(cfg.store.path):  # every array is created here, once, before any task runs
        prep = prepare(cfg)
    groups = split(prep.train_tasks + prep.target_tasks, tasks)
    shares = max(1, min(score_tasks or tasks, score_blocks(cfg, prep)))
    ex = executor(
        folder,
        local,
        partition,
        timeout_min,
        mem_gb,
        cpus_per_task=cpus_per_task,
        gpus_per_node=gpus_per_task,
    )
    shards = ex.map_array(ShardRunner(cfg, prep.checkpoints, prep.width), groups) if groups else []
    _after(ex, shards, local)
    reduce = ex.submit(reduce_and_prepare, cfg, prep.proj_dim, len(prep.checkpoints))
    _after(ex, [reduce], local)
    staged = reduce.paths.result_pickle
    scores = ex.map_array(ScoreRunner(cfg, staged), list(range(shares)), [shares] * shares)
    _after(ex, scores, local)
    results = [j.paths.result_pickle for j in scores]
    merge = ex.submit(merge_and_report, cfg, staged, results, folder / "report")
    return ArrayJobs(shards, reduce, scores, merge)


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    prog = prog or f"python -m {__spec__.name if __spec__ else 'launch.slurm'}"
    parser = argparse.ArgumentParser(
        prog=prog,
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 2)[2],
    )
    sub = parser.add_subparsers(dest="mode", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--partition", default=None)
    common.add_argument("--time-min", type=int, default=60)
    common.add_argument(
        "--folder",
        type=Path,
        default=Path("slurm_jobs"),
        help="submitit logs, pickles and the run report",
    )
    common.add_argument("--local", action="store_true", help="submitit's local executor")
    common.add_argument("--wait", action="store_true", help="wait and print the report")
    ray = sub.add_parser("ray", parents=[common], help="Ray cluster inside one allocation")
    ray.add_argument("--nodes", type=int, default=1)
    ray.add_argument("--cpus-per-node", type=int, default=2)
    ray.add_argument("--gpus-per-node", type=int, default=0)
    ray.add_argument("--mem-gb", type=float, default=8)
    ray.add_argument("--port", type=int, default=6379)
    ray.add_argument("--head-ip", default=None, help="default: the first node's address")
    ray.add_argument(
        "--eval", action="store_true", help="run `trak-dist eval` (the LDS) instead of trak-dist"
    )
    ray.set_defaults(submit=_submit_ray)
    array = sub.add_parser(
        "array", parents=[common], help="shard tasks, reduce job, score tasks, merge job"
    )
    array.add_argument("--tasks", type=int, default=4)
    array.add_argument("--cpus-per-task", type=int, default=1)
    array.add_argument("--gpus-per-task", type=int, default=0)
    array.add_argument("--mem-gb", type=float, default=4)
    array.add_argument(
        "--score-tasks", type=int, default=None, help="score array tasks (default: --tasks)"
    )
    array.set_defaults(submit=_submit_array)
    args, overrides = parser.parse_known_args(argv)
    overrides = [o for o in overrides if o != "--"]
    try:
        _submit(args, overrides, prog)
    except SystemExit as e:  # failures.reported: one line on stderr, exit 2 (130 on Ctrl-C)
        return int(e.code or 0)
    return 0


def _submit(args: argparse.Namespace, overrides: list[str], prog: str) -> None:
    with failures.reported(prog):
        folder = args.folder.resolve()
        try:
            _run(args, overrides, folder)
        except submitit.core.utils.FailedJobError as e:
            # submitit keeps only the text of the job's traceback: its last line says why
            raise WorkerFailedError(
                f"a SLURM job failed: {failures.last_error_line(str(e))}. Its logs are under "
                f"{folder}."
            ) from e


def _run(args: argparse.Namespace, overrides: list[str], folder: Path) -> None:
    final = args.submit(args, resolve_inputs(compose_job(overrides)), folder)
    if args.wait:
        summary = final.results()[0]
        print(f"done: report {summary['report']}")


def _submit_ray(args: argparse.Namespace, cfg: JobConfig, folder: Path) -> submitit.Job[Any]:
    job = submit_ray(
        cfg,
        folder,
        args.nodes,
        args.cpus_per_node,
        args.gpus_per_node,
        args.mem_gb,
        args.time_min,
        args.partition,
        args.port,
        args.head_ip,
        args.local,
        evaluate_and_report if args.eval else None,
    )
    print(f"submitted ray job {job.job_id}; logs: {job.paths.stdout}")
    return job


def _submit_array(args: argparse.Namespace, cfg: JobConfig, folder: Path) -> submitit.Job[Any]:
    jobs = submit_array(
        cfg,
        folder,
        args.tasks,
        args.cpus_per_task,
        args.gpus_per_task,
        args.mem_gb,
        args.time_min,
        args.partition,
        args.local,
        args.score_tasks,
    )
    ids = ", ".join(j.job_id for j in jobs.shards) or "none (all shards committed)"
    scores = ", ".join(j.job_id for j in jobs.scores)
    print(
        f"submitted array tasks {ids}; then reduce job {jobs.reduce.job_id}, score tasks "
        f"{scores} and merge job {jobs.merge.job_id}"
    )
    print(f"logs: {folder}")
    return jobs.merge


if __name__ == "__main__":
    sys.exit(main())
