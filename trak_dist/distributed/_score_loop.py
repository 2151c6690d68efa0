"""Score blocks on worker actors: the Ray executor's scoring stage. Dead workers are replaced
and their blocks rerun as ``RetryPolicy`` allows; committed blocks survive any failure, so a
rerun of the job resumes (docs/design.md, "Scoring at scale")."""

from __future__ import annotations

import logging
import time
from collections import Counter, deque
from collections.abc import Callable
from typing import Any

import ray
from ray.exceptions import RayActorError, RayTaskError

from trak_dist import failures
from trak_dist.config import JobConfig
from trak_dist.distributed import _ray
from trak_dist.distributed._interrupt import CtrlC
from trak_dist.distributed._policy import RetryPolicy
from trak_dist.errors import TrakDistError, WorkerFailedError
from trak_dist.scoring import BlockResult, BlockTask

logger = logging.getLogger("trak_dist.distributed.driver")
OnBlock = Callable[[BlockResult], None]
POLL_S = 1.0


def run_blocks(
    cfg: JobConfig,
    tasks: list[BlockTask],
    policy: RetryPolicy,
    ctrl_c: CtrlC,
    on_block: OnBlock | None = None,
) -> list[BlockResult]:
    """Run ``tasks`` on ``worker_count`` score actors, one block each at a time; returns every
    block's result (in completion order: the merge does not depend on it)."""
    if not tasks:
        return []
    count = _ray.worker_count(cfg.cluster, len(tasks))
    actors: list[Any] = [_ray.start_scorer(cfg) for _ in range(count)]
    pending, idle = deque(tasks), deque(range(count))
    inflight: dict[Any, tuple[BlockTask, int]] = {}
    # replacements of dead workers get blocks once they are up: one whose node is gone may wait
    # for a node that never comes, while the workers left run every block
    starting: dict[Any, int] = {}
    failed: Counter[tuple[int, int]] = Counter()
    results: list[BlockResult] = []
    waited = time.monotonic()

    def replace(slot: int) -> None:
        actors[slot] = _ray.start_scorer(cfg)
        starting[actors[slot].__ray_ready__.remote()] = slot

    try:
        while pending or inflight:
            while pending and idle:
                slot, task = idle.popleft(), pending.popleft()
                inflight[actors[slot].run.remote(task)] = (task, slot)
            ready, _ = ray.wait([*inflight, *starting], num_returns=1, timeout=POLL_S)
            ctrl_c.check()
            if ready or inflight:
                waited = time.monotonic()
            elif time.monotonic() - waited > cfg.cluster.start_timeout_s:
                raise WorkerFailedError(
                    f"no score worker started within {cfg.cluster.start_timeout_s:.0f} s "
                    "(cluster.start_timeout_s) after every worker was lost; the cluster has "
                    f"{ray.cluster_resources()}. Rerun to resume: committed blocks are kept."
                )
            for ref in ready:
                if ref in starting:
                    slot = starting.pop(ref)
                    try:
                        ray.get(ref)
                        idle.append(slot)
                    except RayActorError as e:
                        policy.worker_lost(f"score worker {slot} failed to start", e)
                        replace(slot)
                    continue
                task, slot = inflight.pop(ref)
                where = (task.row_range, task.super_block)
                try:
                    result: BlockResult = ray.get(ref)
                except RayActorError as e:
                    policy.worker_lost(f"score worker {slot} died running block {where}", e)
                    replace(slot)
                    pending.appendleft(task)
                    policy.retries += 1
                    continue
                except RayTaskError as e:
                    cause = failures.unwrap(e)
                    if isinstance(cause, TrakDistError | OSError):
                        # non-finite scores, a damaged store, a full disk: not retried
                        raise cause from e
                    failed[where] += 1
                    if failed[where] > policy.max_retries:
                        raise WorkerFailedError(
                            f"score block {where} failed {failed[where]} times; last error: "
                            f"{failures.gist(cause)}. Fix the cause and rerun: committed "
                            "blocks are kept."
                        ) from e
                    logger.warning("score block %s failed (%s); retrying", where, cause)
                    pending.appendleft(task)
                    policy.retries += 1
                    idle.append(slot)
                    continue
                results.append(result)
                idle.append(slot)
                if on_block is not None:
                    on_block(result)
    finally:
        _ray.stop(actors, force=bool(inflight or starting))
        if inflight:
            ready, _ = ray.wait(list(inflight), num_returns=len(inflight), timeout=2.0)
            for ref in ready:
                try:
                    ray.get(ref, timeout=1.0)
                except Exception:
                    logger.debug("a score block stopped with its worker")
    return results
