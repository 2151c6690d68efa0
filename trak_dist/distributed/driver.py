"""The Ray driver: hands shards to worker actors, forwards partial XᵀX to the reducer, scores.

State lives in one dataclass; the loop waits on ``ray.wait(..., timeout=…)``. A worker that dies
is replaced (at most ``cluster.max_worker_restarts`` times) and its shard rerun; a shard that
raises is retried at most ``featurize.max_task_retries`` times. Committed chunks survive any
failure, so rerunning a killed job resumes where it stopped.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ray
from ray.exceptions import RayActorError, RayTaskError
from tqdm.auto import tqdm

from trak_dist import failures
from trak_dist.config import JobConfig
from trak_dist.distributed import _ray
from trak_dist.distributed._prepare import Prepared, prepare
from trak_dist.distributed._queue import TaskQueue
from trak_dist.distributed._state import DriverState, JobResult
from trak_dist.distributed._tasks import ShardResult, ShardTask
from trak_dist.errors import TrakDistError, WorkerFailedError
from trak_dist.store import store_lock

logger = logging.getLogger(__name__)
POLL_S = 1.0


def _absolute_store(cfg: JobConfig) -> JobConfig:
    """Workers run in their own working directory (or on another node): ship absolute paths."""
    if "://" in cfg.store.path:
        return cfg
    path = Path(cfg.store.path)
    if not path.is_absolute() and cfg.cluster.kind != "local":
        logger.warning(
            "store.path=%s is relative: it resolves to %s on the driver's machine (under `ray "
            "job submit`, the job's temporary directory). Give a shared absolute path.",
            path,
            path.resolve(),
        )
    store = dataclasses.replace(cfg.store, path=str(path.resolve()))
    return dataclasses.replace(cfg, store=store)


def run_job(
    cfg: JobConfig,
    variants: list[tuple[int, float | str]] | None = None,
    on_shard: Callable[[ShardResult], None] | None = None,
    keep_alive: bool = False,
) -> JobResult:
    """Featurise what the store lacks, reduce, and score ``variants`` ((proj_dim, λ) pairs;
    default the job's own).

    Args:
        cfg: the job.
        variants: (proj_dim, lambda_reg) pairs to score (λ a number or ``"auto"``).
        on_shard: called after each finished shard (progress hooks, fault-injection tests).
        keep_alive: leave Ray and the reducer running for the next call in this process
            (sweeps); they stop at interpreter exit.
    """
    phases: dict[str, float] = {}
    t0 = time.perf_counter()
    cfg = _absolute_store(cfg)
    started = False
    state = DriverState(TaskQueue())
    reducer = None
    interrupted = False
    # Ctrl-C noted even while Ray blocks (see _interrupt.py); the previous handler after
    with state.ctrl_c:
        try:
            # Featurising, reducing and factorising are serialised per store: concurrent jobs of a
            # sweep (e.g. one SLURM job per point) would otherwise all featurise, and rewrite the
            # shared factor arrays under each other's readers. Scoring writes per-variant arrays
            # and runs unlocked, in parallel.
            with store_lock(cfg.store.path):
                prep = prepare(cfg)
                variants = variants or [(prep.proj_dim, cfg.lambda_reg)]
                started = _ray.connect(cfg.cluster)
                phases["setup"] = time.perf_counter() - t0
                state.pending.extend(prep.train_tasks + prep.target_tasks)
                state.rows_reused.update(prep.rows_done)
                for t in prep.train_tasks:
                    state.train_left[t.model_id] = state.train_left.get(t.model_id, 0) + 1
                reducer = _ray.Session.reducer(cfg) if keep_alive else _ray.start_reducer(cfg)
                t1 = time.perf_counter()
                proj_dims = sorted({p for p, _ in variants})
                _featurize(cfg, prep, state, reducer, on_shard)
                ready = state.first_ready or t1
                phases["worker_start"] = ready - t1
                phases["featurize"] = time.perf_counter() - ready
                t2 = time.perf_counter()
                _get(state, state.finish_refs)
                ids = list(range(len(prep.checkpoints)))
                conditioning = _get(state, reducer.factorize.remote(ids, proj_dims))
                phases["reduce"] = time.perf_counter() - t2
            t3 = time.perf_counter()
            scores = []
            s = cfg.scoring
            for p, lam in tqdm(variants, desc="scoring", disable=not cfg.progress, unit="variant"):
                scores.append(
                    _get(
                        state,
                        reducer.score.remote(
                            s.exp_name,
                            ids,
                            p,
                            lam,
                            s.kinv_scaling,
                            s.topk,
                            s.train_block,
                            s.target_block,
                        ),
                    )
                )
            phases["score"] = time.perf_counter() - t3
        except KeyboardInterrupt:
            interrupted = True  # Ctrl-C: no polite wait for the shards in flight
            raise
        finally:
            actors = state.workers if keep_alive or reducer is None else [*state.workers, reducer]
            _ray.stop(actors, force=interrupted)
            _drain(state)
            if started and (interrupted or not keep_alive):
                ray.shutdown()
    phases["total"] = time.perf_counter() - t0
    return JobResult(
        store=cfg.store.path,
        exp=cfg.scoring.exp_name,
        n=prep.n,
        m=prep.m,
        checkpoints=len(prep.checkpoints),
        proj_dim=prep.width,
        scores=scores,
        phases=phases,
        rows_computed=state.rows_computed,
        rows_reused=state.rows_reused,
        worker_restarts=state.restarts,
        task_retries=state.retries,
        conditioning=conditioning,
    )


def _get(state: DriverState, refs: Any) -> Any:
    """``ray.get``, polled so that Ctrl-C is seen (``CtrlC``), raising an expected failure of
    the reducer as itself (no Ray wrapper)."""
    waiting = list(refs) if isinstance(refs, list) else [refs]
    while waiting:
        state.ctrl_c.check()
        _, waiting = ray.wait(waiting, num_returns=len(waiting), timeout=POLL_S)
    state.ctrl_c.check()
    try:
        return ray.get(refs)
    except RayTaskError as e:
        cause = failures.unwrap(e)
        if cause is not e and failures.describe(cause) is not None:
            raise cause from e
        raise


def _featurize(
    cfg: JobConfig,
    prep: Prepared,
    state: DriverState,
    reducer: Any,
    on_shard: Callable[[ShardResult], None] | None,
) -> None:
    if not state.pending:
        return
    count = _ray.worker_count(cfg.cluster, len(state.pending))
    state.workers = [None] * count
    for slot in range(count):
        _start(cfg, prep, state, slot)
    bars = {
        kind: tqdm(
            total=sum(t.rows for t in state.pending if t.kind == kind),
            desc=f"{kind} features",
            unit="row",
            disable=not cfg.progress,
        )
        for kind in ("train", "target")
    }
    try:
        while state.pending or state.inflight:
            _fill(state)
            ready, _ = ray.wait([*state.inflight, *state.starting], num_returns=1, timeout=POLL_S)
            state.ctrl_c.check()
            if not ready:
                _check_stalled(cfg, state)
            for ref in ready:
                if ref in state.starting:
                    _started(cfg, prep, state, ref)
                    continue
                task, slot, xtx_ref = state.inflight.pop(ref)
                result = _collect(cfg, prep, state, ref, task, slot, xtx_ref)
                if result is None:
                    continue
                state.last_progress = time.perf_counter()
                state.idle.append(slot)
                kind = task.kind
                state.rows_computed[kind] += result.rows_computed
                state.rows_reused[kind] += result.rows_reused
                bars[kind].update(task.rows)
                if kind == "train":
                    reducer.add.remote(task.model_id, task.start, task.end, xtx_ref)
                    state.train_left[task.model_id] -= 1
                    if state.train_left[task.model_id] == 0:
                        state.finish_refs.append(reducer.finish_checkpoint.remote(task.model_id))
                _fill(state)  # keep workers busy before anything slower
                if on_shard is not None:
                    on_shard(result)
    finally:
        for bar in bars.values():
            bar.close()
    _ray.stop(state.workers)
    state.workers = []


def _start(cfg: JobConfig, prep: Prepared, state: DriverState, slot: int) -> None:
    """Start the worker of ``slot``; it gets shards once it reports ready."""
    actor = _ray.start_worker(cfg, prep.checkpoints, prep.width)
    state.workers[slot] = actor
    state.starting[actor.__ray_ready__.remote()] = slot


def _started(cfg: JobConfig, prep: Prepared, state: DriverState, ref: Any) -> None:
    slot = state.starting.pop(ref)
    try:
        ray.get(ref)
    except RayActorError as e:
        if e.actor_init_failed:
            # the constructor raised (bad config, unreadable store, import error): every
            # replacement would fail the same way. Ray keeps only the text of its traceback.
            raise WorkerFailedError(
                f"a worker failed to start: {failures.last_error_line(str(e))}. Fix the cause "
                "and rerun (TRAK_DIST_DEBUG=1 shows the worker's traceback)."
            ) from e
        _replace(cfg, prep, state, slot, f"worker {slot} failed to start", e)
        return
    state.last_progress = time.perf_counter()
    if state.first_ready is None:
        state.first_ready = state.last_progress
    state.idle.append(slot)


def _check_stalled(cfg: JobConfig, state: DriverState) -> None:
    """Fail, rather than wait forever, when no worker could be scheduled."""
    waited = time.perf_counter() - state.last_progress
    if not state.inflight and state.starting and waited > cfg.cluster.start_timeout_s:
        raise WorkerFailedError(
            f"no worker started within {cfg.cluster.start_timeout_s:.0f} s "
            f"(cluster.start_timeout_s): the cluster lacks the resources one worker asks for "
            f"(cpus_per_worker={cfg.cluster.cpus_per_worker}, gpus_per_worker="
            f"{cfg.cluster.gpus_per_worker}); it has {ray.cluster_resources()}."
        )


def _replace(
    cfg: JobConfig, prep: Prepared, state: DriverState, slot: int, what: str, e: Exception
) -> None:
    state.restarts += 1
    if state.restarts > cfg.cluster.max_worker_restarts:
        raise WorkerFailedError(
            f"{what} and the job already replaced {cfg.cluster.max_worker_restarts} workers "
            f"(cluster.max_worker_restarts). Last cause: {e}. Rerun the same command to resume "
            "from committed chunks."
        ) from e
    logger.warning("%s; replacing it", what)
    _start(cfg, prep, state, slot)


def _fill(state: DriverState) -> None:
    while state.pending and state.idle:
        slot = state.idle.popleft()
        task = state.pending.pop_for(slot)
        meta, xtx = state.workers[slot].run.options(num_returns=2).remote(task)
        state.inflight[meta] = (task, slot, xtx)


def _drain(state: DriverState) -> None:
    """After a failure: read the errors of the shards still in flight (their workers failed
    too, or were stopped), so that Ray prints none of them as an "Unhandled error"."""
    refs = [r for meta, (_, _, xtx) in state.inflight.items() for r in (meta, xtx)]
    state.inflight.clear()
    if refs:
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=2.0)
        for ref in ready:
            _consume(ref)


def _consume(ref: Any) -> None:
    """Read the failed task's other return (its error, ready with the first) so that Ray does
    not print it as an "Unhandled error" traceback when the reference is dropped."""
    # the same error, already being handled through the first reference
    with contextlib.suppress(Exception):
        ray.get(ref, timeout=1.0)


def _collect(
    cfg: JobConfig,
    prep: Prepared,
    state: DriverState,
    ref: Any,
    task: ShardTask,
    slot: int,
    xtx_ref: Any,
) -> ShardResult | None:
    """The shard's result, or None after arranging a rerun (raises when out of retries)."""
    try:
        return ray.get(ref)
    except RayActorError as e:
        _replace(cfg, prep, state, slot, f"worker {slot} died running {task}", e)
    except RayTaskError as e:
        _consume(xtx_ref)
        cause = failures.unwrap(e)
        if isinstance(cause, TrakDistError):
            # raised on purpose (bad data, a mismatched store): a retry would only repeat it
            raise cause from e
        what = failures.gist(cause)
        if task.attempt >= cfg.featurize.max_task_retries:
            raise WorkerFailedError(
                f"{task} failed {task.attempt + 1} times (featurize.max_task_retries="
                f"{cfg.featurize.max_task_retries}); last error: {what}. Fix the cause and "
                "rerun: committed chunks are kept."
            ) from e
        logger.warning("%s failed (%s); retrying", task, what)
        state.idle.append(slot)
    state.retries += 1
    state.pending.push_front(task.retry())
    return None
