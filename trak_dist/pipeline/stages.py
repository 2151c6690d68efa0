"""The stages of a job, in order: the one description every executor runs (``run_pipeline``).

    resolve inputs   the driver   paths and names become what workers load (``inputs.py``)
    plan             the driver   the store and all its arrays created, the shards still to run
    featurize        workers      shards → committed rows (and their partial XᵀX, streamed to
                                  the reducer by executors that keep one alive)
    reduce           the reducer  XᵀX per checkpoint (from the partials, else from the committed
                                  rows), one factorisation per checkpoint and proj_dim
    score            the reducer prepares each variant (λ, Y, the plan, the blocks still to run),
                     workers      run the blocks, the reducer merges and publishes: the score
                                  step (``trak_dist.scoring.score_step``, one rule for errors)

An executor (``executor.py``) decides only where each runs: ``InProcessExecutor`` here (tests,
debugging, ``cluster=inprocess``), the Ray executor on actors (``trak_dist.distributed``), the
SLURM executor as a chain of jobs submitted at once, each stage on workers an array and the
reducer's stages between them one dependent job (``launch/``). Plan, featurize and reduce hold
the store's lock: concurrent jobs of a sweep then featurise once, and never rewrite the shared
factors under each other's readers; scoring writes per-variant arrays and runs unlocked."""

from __future__ import annotations

import time

from trak_dist.config import JobConfig
from trak_dist.pipeline.executor import Executor, InProcessExecutor, OnShard
from trak_dist.pipeline.inputs import resolve_inputs
from trak_dist.pipeline.plan import prepare
from trak_dist.pipeline.results import FeaturizeReport, JobResult
from trak_dist.scoring import LambdaReg, ScoreRequest, ScoreResult, score_step
from trak_dist.store import FORMAT_VERSION

Variants = list[tuple[int, LambdaReg]]


def run_pipeline(
    cfg: JobConfig,
    executor: Executor | None = None,
    variants: Variants | None = None,
    on_shard: OnShard | None = None,
) -> JobResult:
    """Featurise what the store lacks, reduce, factorise and score ``variants`` ((proj_dim, λ)
    pairs; default the job's own) with ``executor`` (default ``InProcessExecutor``);
    ``on_shard`` runs after each finished shard (progress hooks, fault-injection tests). The
    SLURM executor returns what its last job will return."""
    executor = executor or InProcessExecutor()
    t0 = time.perf_counter()
    phases: dict[str, float] = {}
    cfg = resolve_inputs(cfg)
    with executor.session(cfg):
        with executor.lock(cfg.store):
            prep = prepare(cfg)
            executor.start(cfg, prep)
            phases["setup"] = time.perf_counter() - t0
            feats = executor.featurize(cfg, prep, on_shard)
            t1 = time.perf_counter()
            ids = list(range(len(prep.checkpoints)))
            variants = variants or [(prep.proj_dim, cfg.lambda_reg)]
            conditioning = executor.reduce(ids, sorted({p for p, _ in variants}))
            phases["reduce"] = time.perf_counter() - t1
        t2 = time.perf_counter()
        requests = [ScoreRequest(cfg.scoring, tuple(ids), p, lam) for p, lam in variants]
        scores = score_step(executor.scoring(), requests, executor.run_blocks)
        phases["score"] = time.perf_counter() - t2
        phases["total"] = time.perf_counter() - t0
        sizes = (prep.n, prep.m, prep.width, len(prep.checkpoints))
        result: JobResult = executor.conclude(
            job_result, cfg, sizes, prep.rows_done, feats, conditioning, scores, phases=phases
        )
        return result


def job_result(
    cfg: JobConfig,
    sizes: tuple[int, int, int, int],
    rows_done: dict[str, int],
    feats: FeaturizeReport | list[FeaturizeReport],
    conditioning: dict[int, dict[int, float]],
    scores: list[ScoreResult],
    phases: dict[str, float],
) -> JobResult:
    """What the run did (``sizes``: n, m, the stored width, checkpoints; ``feats``: one
    report, or one per array task; rows the plan left out, ``rows_done``, count as reused)."""
    reports = feats if isinstance(feats, list) else [feats]
    total = FeaturizeReport()
    for r in reports:
        for kind in total.rows_computed:
            total.rows_computed[kind] += r.rows_computed.get(kind, 0)
            total.rows_reused[kind] += r.rows_reused.get(kind, 0)
    slowest = max(reports, key=lambda r: r.featurize_s, default=total)
    n, m, width, checkpoints = sizes
    phases = {**phases, "worker_start": slowest.worker_start_s, "featurize": slowest.featurize_s}
    order = ("setup", "worker_start", "featurize", "reduce", "score", "total")  # as they ran
    phases = {k: phases[k] for k in order if k in phases}
    return JobResult(
        store=cfg.store.path,
        exp=cfg.scoring.exp_name,
        n=n,
        m=m,
        checkpoints=checkpoints,
        proj_dim=width,
        scores=scores,
        phases=phases,
        rows_computed=total.rows_computed,
        rows_reused={k: v + rows_done.get(k, 0) for k, v in total.rows_reused.items()},
        worker_restarts=sum(r.worker_restarts for r in reports),
        task_retries=sum(r.task_retries for r in reports),
        conditioning=conditioning,
        format_version=FORMAT_VERSION,
        store_options=dict(cfg.store.options),
    )
