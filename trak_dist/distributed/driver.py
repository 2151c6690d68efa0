"""The Ray executor: hands shards to worker actors, forwards partial XᵀX to the reducer actor.
State lives in one dataclass; the loop polls ``ray.wait``. Dead workers are replaced and failed
shards retried as ``RetryPolicy`` allows; committed chunks survive, so reruns resume."""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Iterator
from typing import Any

import ray
from ray.exceptions import RayActorError, RayTaskError
from tqdm.auto import tqdm

from trak_dist import failures
from trak_dist.config import JobConfig
from trak_dist.distributed import _ray
from trak_dist.distributed._policy import RetryPolicy
from trak_dist.distributed._score_loop import OnBlock, run_blocks
from trak_dist.distributed._state import DriverState
from trak_dist.errors import WorkerFailedError
from trak_dist.pipeline import (
    Executor,
    FeaturizeReport,
    JobResult,
    OnShard,
    Prepared,
    ShardResult,
    ShardTask,
    run_pipeline,
)
from trak_dist.scoring import BlockResult, BlockTask, ScoreRequest, ScoreResult

POLL_S = 1.0


def run_job(
    cfg: JobConfig,
    variants: list[tuple[int, float | str]] | None = None,
    on_shard: OnShard | None = None,
    keep_alive: bool = False,
    on_block: OnBlock | None = None,
) -> JobResult:
    """``run_pipeline`` on Ray for ``variants`` ((proj_dim, λ) pairs; λ a number or ``"auto"``);
    ``on_shard`` runs after each shard, ``on_block`` after each score block; ``keep_alive``
    keeps Ray and the reducer (sweeps)."""
    return run_pipeline(cfg, RayExecutor(keep_alive, on_block), variants, on_shard)


class RayExecutor(Executor):
    """Shards on worker actors (one per slot, replaced when they die), the reducer in an actor;
    ``keep_alive`` keeps Ray and the reducer for the next run in this process (sweeps)."""

    def __init__(self, keep_alive: bool = False, on_block: OnBlock | None = None) -> None:
        self.keep_alive = keep_alive
        self.on_block = on_block
        self.state = DriverState()
        self.reducer: Any = None
        self.started = False

    @contextlib.contextmanager
    def session(self, cfg: JobConfig) -> Iterator[None]:
        state, interrupted = self.state, False
        # Ctrl-C noted even while Ray blocks (see _interrupt.py); the previous handler after
        with state.ctrl_c:
            try:
                yield
            except KeyboardInterrupt:
                interrupted = True  # Ctrl-C: no polite wait for the shards in flight
                raise
            finally:
                keep = self.keep_alive or self.reducer is None
                _ray.stop(
                    state.workers if keep else [*state.workers, self.reducer], force=interrupted
                )
                _drain(state)
                if self.started and (interrupted or not self.keep_alive):
                    _ray.shutdown()

    def start(self, cfg: JobConfig, prep: Prepared) -> None:
        self.cfg, self.prep = cfg, prep
        self.policy = RetryPolicy(cfg.cluster.max_worker_restarts, cfg.featurize.max_task_retries)
        self.started = _ray.connect(cfg.cluster)
        self.reducer = _ray.Session.reducer(cfg) if self.keep_alive else _ray.start_reducer(cfg)

    def featurize(
        self, cfg: JobConfig, prep: Prepared, on_shard: OnShard | None
    ) -> FeaturizeReport:
        state = self.state
        t1 = time.perf_counter()
        state.pending.extend(prep.train_tasks + prep.target_tasks)
        self._loop(on_shard)
        ready = state.first_ready or t1
        return FeaturizeReport(
            state.rows_computed,
            state.rows_reused,
            self.policy.restarts,
            self.policy.retries,
            worker_start_s=ready - t1,
            featurize_s=time.perf_counter() - ready,
        )

    def reduce(self, model_ids: list[int], proj_dims: list[int]) -> dict[int, dict[int, float]]:
        self._get(self.state.partials)  # the last of a checkpoint writes its XᵀX
        result: dict[int, dict[int, float]] = self._get(
            self.reducer.reduce.remote(model_ids, proj_dims)
        )
        return result

    # the score step: the reducer actor prepares (Y, the plan, the blocks not yet committed),
    # worker actors run the blocks in parallel, the reducer merges and publishes
    def scoring(self) -> RayExecutor:
        return self

    def prepare_scores(self, requests: list[ScoreRequest]) -> list[BlockTask]:
        self._restarts = self.policy.restarts
        tasks: list[BlockTask] = self._get(self.reducer.prepare_scores.remote(requests))
        return tasks

    def finish_scores(
        self, requests: list[ScoreRequest], results: list[BlockResult]
    ) -> list[ScoreResult]:
        done: list[ScoreResult] = self._get(self.reducer.finish_scores.remote(requests, results))
        restarts = self.policy.restarts - self._restarts
        return [dataclasses.replace(r, worker_restarts=restarts) for r in done]

    def stop_scores(self, discard: bool = False) -> None:
        if discard:
            self._get(self.reducer.stop_scores.remote(True))
        else:  # e.g. Ctrl-C: not waited for (the session's end stops the actor anyway)
            self.reducer.stop_scores.remote(False)

    def run_blocks(self, tasks: list[BlockTask]) -> list[BlockResult]:
        return run_blocks(self.cfg, tasks, self.policy, self.state.ctrl_c, self.on_block)

    def _get(self, refs: Any) -> Any:
        """``ray.get``, polled so that Ctrl-C is seen (``CtrlC``), raising an expected failure
        of the reducer as itself (no Ray wrapper)."""
        waiting = list(refs) if isinstance(refs, list) else [refs]
        while waiting:
            self.state.ctrl_c.check()
            _, waiting = ray.wait(waiting, num_returns=len(waiting), timeout=POLL_S)
        self.state.ctrl_c.check()
        try:
            return ray.get(refs)
        except RayTaskError as e:
            cause = failures.unwrap(e)
            if cause is not e and failures.describe(cause) is not None:
                raise cause from e
            raise

    def _loop(self, on_shard: OnShard | None) -> None:
        cfg, state = self.cfg, self.state
        if not state.pending:
            return
        count = _ray.worker_count(cfg.cluster, len(state.pending))
        state.workers = [None] * count
        for slot in range(count):
            self._start(slot)
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
                self._fill()
                waiting = [*state.inflight, *state.starting]
                ready, _ = ray.wait(waiting, num_returns=1, timeout=POLL_S)
                state.ctrl_c.check()
                if not ready:
                    self._check_stalled()
                for ref in ready:
                    if ref in state.starting:
                        self._started(ref)
                        continue
                    task, slot, xtx_ref = state.inflight.pop(ref)
                    result = self._collect(ref, task, slot, xtx_ref)
                    if result is None:
                        continue
                    state.last_progress = time.perf_counter()
                    state.idle.append(slot)
                    state.rows_computed[task.kind] += result.rows_computed
                    state.rows_reused[task.kind] += result.rows_reused
                    bars[task.kind].update(task.rows)
                    if task.kind == "train":
                        add = self.reducer.add.remote(task.model_id, task.start, task.end, xtx_ref)
                        state.partials.append(add)
                    self._fill()  # keep workers busy before anything slower
                    if on_shard is not None:
                        on_shard(result)
        finally:
            for bar in bars.values():
                bar.close()
        _ray.stop(state.workers)
        state.workers = []

    def _start(self, slot: int) -> None:
        """Start the worker of ``slot``; it gets shards once it reports ready."""
        actor = _ray.start_worker(self.cfg, self.prep.checkpoints, self.prep.width)
        self.state.workers[slot] = actor
        self.state.starting[actor.__ray_ready__.remote()] = slot

    def _started(self, ref: Any) -> None:
        state = self.state
        slot = state.starting.pop(ref)
        try:
            ray.get(ref)
        except RayActorError as e:
            if e.actor_init_failed:
                # the constructor raised (bad config, unreadable store, import error): every
                # replacement would fail the same way. Ray keeps only the text of its traceback.
                raise WorkerFailedError(
                    f"a worker failed to start: {failures.last_error_line(str(e))}. Fix the "
                    "cause and rerun (TRAK_DIST_DEBUG=1 shows the worker's traceback)."
                ) from e
            self.policy.worker_lost(f"worker {slot} failed to start", e)
            self._start(slot)
            return
        state.last_progress = time.perf_counter()
        if state.first_ready is None:
            state.first_ready = state.last_progress
        state.idle.append(slot)

    def _check_stalled(self) -> None:
        """Fail, rather than wait forever, when no worker could be scheduled."""
        c, state = self.cfg.cluster, self.state
        waited = time.perf_counter() - state.last_progress
        if not state.inflight and state.starting and waited > c.start_timeout_s:
            raise WorkerFailedError(
                f"no worker started within {c.start_timeout_s:.0f} s "
                f"(cluster.start_timeout_s): the cluster lacks the resources one worker asks for "
                f"(cpus_per_worker={c.cpus_per_worker}, gpus_per_worker="
                f"{c.gpus_per_worker}); it has {ray.cluster_resources()}."
            )

    def _fill(self) -> None:
        state = self.state
        while state.pending and state.idle:
            slot = state.idle.popleft()
            task = state.pending.pop_for(slot)
            meta, xtx = state.workers[slot].run.options(num_returns=2).remote(task)
            state.inflight[meta] = (task, slot, xtx)

    def _collect(self, ref: Any, task: ShardTask, slot: int, xtx_ref: Any) -> ShardResult | None:
        """The shard's result, or None after arranging a rerun (raises when the policy gives
        up)."""
        try:
            result: ShardResult = ray.get(ref)
            return result
        except RayActorError as e:
            self.policy.worker_lost(f"worker {slot} died running {task}", e)
            self._start(slot)
        except RayTaskError as e:
            _consume(xtx_ref)
            self.policy.task_failed(task, e)
            self.state.idle.append(slot)
        self.state.pending.push_front(self.policy.rerun(task))
        return None


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
