"""``run_pipeline``: the order of the stages and the bookkeeping of a run; ``finish_from_store``:
reduce → factorise → score of committed features (the SLURM array's dependent job)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

from tqdm.auto import tqdm

from trak_dist.config import JobConfig
from trak_dist.pipeline.executor import Executor, InProcessExecutor, OnShard, reducer_device
from trak_dist.pipeline.inputs import resolve_inputs
from trak_dist.pipeline.plan import prepare
from trak_dist.pipeline.reducer import Reducer
from trak_dist.pipeline.results import FeaturizeReport, JobResult
from trak_dist.scoring import LambdaReg, ScoreRequest, ScoreResult
from trak_dist.store import FeatureStore, store_lock

Variants = list[tuple[int, LambdaReg]]


def run_pipeline(
    cfg: JobConfig,
    executor: Executor | None = None,
    variants: Variants | None = None,
    on_shard: OnShard | None = None,
) -> JobResult:
    """Featurise what the store lacks, reduce, factorise and score ``variants`` ((proj_dim, λ)
    pairs; default the job's own) with ``executor`` (default ``InProcessExecutor``);
    ``on_shard`` runs after each finished shard (progress hooks, fault-injection tests)."""
    executor = executor or InProcessExecutor()
    phases: dict[str, float] = {}
    t0 = time.perf_counter()
    cfg = resolve_inputs(cfg)
    with executor.session(cfg):
        # Featurising, reducing and factorising are serialised per store: concurrent jobs of a
        # sweep (e.g. one SLURM job per point) would otherwise all featurise, and rewrite the
        # shared factor arrays under each other's readers. Scoring writes per-variant arrays
        # and runs unlocked, in parallel.
        with store_lock(cfg.store.path, options=cfg.store.options):
            prep = prepare(cfg)
            variants = variants or [(prep.proj_dim, cfg.lambda_reg)]
            executor.start(cfg, prep)
            phases["setup"] = time.perf_counter() - t0
            feats = executor.featurize(cfg, prep, on_shard)
            phases["worker_start"] = feats.worker_start_s
            phases["featurize"] = feats.featurize_s
            t2 = time.perf_counter()
            ids = list(range(len(prep.checkpoints)))
            conditioning = executor.factorize(ids, sorted({p for p, _ in variants}))
            phases["reduce"] = time.perf_counter() - t2
        t3 = time.perf_counter()
        scores = score_variants(cfg, executor.score, ids, variants, cfg.progress)
        phases["score"] = time.perf_counter() - t3
    phases["total"] = time.perf_counter() - t0
    reused = {k: prep.rows_done[k] + feats.rows_reused[k] for k in feats.rows_reused}
    return job_result(cfg, prep.store, len(prep.checkpoints), scores, phases, conditioning,
                       dataclasses.replace(feats, rows_reused=reused))  # fmt: skip


def score_variants(
    cfg: JobConfig,
    score: Callable[[ScoreRequest], ScoreResult],
    model_ids: list[int],
    variants: Variants,
    progress: bool = False,
) -> list[ScoreResult]:
    """Score each variant in turn through ``score`` (an executor's or a reducer's)."""
    bar = tqdm(variants, desc="scoring", disable=not progress, unit="variant")
    return [score(ScoreRequest(cfg.scoring, tuple(model_ids), p, lam)) for p, lam in bar]


def reduce_stored(
    cfg: JobConfig, checkpoints: int, variants: Variants
) -> tuple[Reducer, dict[int, dict[int, float]], float]:
    """XᵀX of train rows committed without streaming partials (SLURM array tasks) and the
    factors ``variants`` need, under the store's lock; StoreStateError if a checkpoint has
    chunks not featurised. Returns the reducer, the condition numbers and the seconds."""
    t0 = time.perf_counter()
    ids = list(range(checkpoints))
    with store_lock(cfg.store.path, options=cfg.store.options):
        reducer = Reducer(cfg.store.path, reducer_device(cfg), cfg.store.options)
        for mid in ids:
            reducer.reduce_stored(mid)
        conditioning = reducer.factorize(ids, sorted({p for p, _ in variants}))
    return reducer, conditioning, time.perf_counter() - t0


def finish_from_store(cfg: JobConfig, checkpoints: int, variants: Variants) -> JobResult:
    """Reduce → factorise → score here, every block in this process (``reduce_stored``)."""
    reducer, conditioning, reduce_s = reduce_stored(cfg, checkpoints, variants)
    t1 = time.perf_counter()
    scores = score_variants(cfg, reducer.score, list(range(checkpoints)), variants)
    phases = {"reduce": reduce_s, "score": time.perf_counter() - t1}
    # what the array tasks computed and reused is in their own results
    done = FeaturizeReport(rows_computed={}, rows_reused={})
    return job_result(cfg, reducer.store, checkpoints, scores, phases, conditioning, done)


def job_result(
    cfg: JobConfig,
    store: FeatureStore,
    checkpoints: int,
    scores: list[ScoreResult],
    phases: dict[str, float],
    conditioning: dict[int, dict[int, float]],
    feats: FeaturizeReport,
) -> JobResult:
    return JobResult(
        store=cfg.store.path,
        exp=cfg.scoring.exp_name,
        n=store.spec.train_size,
        m=store.num_targets(cfg.scoring.exp_name),
        checkpoints=checkpoints,
        proj_dim=store.spec.proj_dim,
        scores=scores,
        phases=phases,
        rows_computed=feats.rows_computed,
        rows_reused=feats.rows_reused,
        worker_restarts=feats.worker_restarts,
        task_retries=feats.task_retries,
        conditioning=conditioning,
        format_version=store.spec.format_version,
        store_options=dict(cfg.store.options),
    )
