"""The SLURM executor: ``run_pipeline``'s stages as a chain of jobs submitted at once, each
waiting for the one before (``afterok``; with ``--kill-on-invalid-dep`` a failed or cancelled
job cancels what waits for it): featurize is an array (``ShardRunner``: a contiguous group of
shards per task, requeued on preemption, skipping committed chunks), reduce and the score
step's prepare one job, the blocks an array (``ScoreRunner``: a contiguous share per task), the
score step's finish (and what the launcher adds) one job.

Here the stages' calls return ``Later`` values: names in the state each serial job extends
and returns (its submitit result file), which the jobs after it read. A job cannot hold a
submitit Job (the local executor's does not pickle): it reads those files."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import submitit
import torch

from trak_dist.config import JobConfig
from trak_dist.errors import WorkerFailedError
from trak_dist.pipeline import (
    Executor,
    FeaturizeReport,
    OnShard,
    Prepared,
    Reducer,
    ShardTask,
    Worker,
    reducer_device,
)
from trak_dist.scoring import BlockResult, BlockTask, ScorePlan, Scorer, ScoreRequest, discards
from trak_dist.store import store_lock

Op = tuple[str, Callable[..., Any], tuple[Any, ...]]
# the run report's phases, as the jobs measured them (the submitting process only plans)
PHASES = {"reduce": "reduce", "prepare": "score", "finish": "score"}


@dataclass(frozen=True)
class Later:
    """The value named ``name`` in the chain's state, once the job that computes it has run."""

    name: str


def output(result_file: Path) -> Any:
    """What an earlier job of the chain returned, read from its submitit result file."""
    outcome, value = submitit.core.utils.pickle_load(result_file)
    if outcome != "success":
        raise WorkerFailedError(f"the job that wrote {result_file} failed: {value}")
    return value


def use_allocation() -> None:
    """Torch's threads as the task's CPUs, not the node's cores (tasks share nodes; and Y and
    the blocks round alike in every task of the same size)."""
    cpus = os.environ.get("SLURM_CPUS_PER_TASK")
    if cpus:
        torch.set_num_threads(int(cpus))


def split(tasks: list[ShardTask], parts: int) -> list[list[ShardTask]]:
    """``parts`` contiguous groups of about equal rows (a group mostly stays on one checkpoint,
    so its worker loads it and generates its projection once)."""
    total = sum(t.rows for t in tasks)
    groups: list[list[ShardTask]] = [[] for _ in range(max(1, parts))]
    done = 0
    for t in tasks:
        groups[min(len(groups) - 1, done * len(groups) // max(1, total))].append(t)
        done += t.rows
    return [g for g in groups if g]


def share(blocks: list[BlockTask], index: int, shares: int) -> list[BlockTask]:
    """Share ``index`` of ``shares``: contiguous, of about equal size (a share mostly stays in
    one super-block, whose Y its blocks read)."""
    return blocks[index * len(blocks) // shares : (index + 1) * len(blocks) // shares]


def pending(prepared: list[Any]) -> list[BlockTask]:
    """The blocks of the scorings a reduce job prepared (its ``Scorer.hand_over``)."""
    return [t for ref in prepared for t in ref.pending]


class ShardRunner(submitit.helpers.Checkpointable):
    """A featurize task: its shards with the plain Worker (XᵀX is summed later, from the
    store); requeued, it skips the chunks committed before the interruption."""

    def __init__(self, cfg: JobConfig, checkpoints: list[Path], width: int) -> None:
        self.cfg, self.checkpoints, self.width = cfg, checkpoints, width

    def __call__(self, tasks: list[ShardTask]) -> FeaturizeReport:
        worker, report = Worker(self.cfg, self.checkpoints, self.width), FeaturizeReport()
        for task in tasks:
            result, _ = worker.run(task)
            report.rows_computed[task.kind] += result.rows_computed
            report.rows_reused[task.kind] += result.rows_reused
        return report


class ScoreRunner(submitit.helpers.Checkpointable):
    """A score task: share ``index`` of ``shares`` of the blocks prepared before it, skipping
    committed ones (a requeued task, or a rerun of the launch, redoes none)."""

    def __init__(self, cfg: JobConfig, state: Path, prepared: Later) -> None:
        self.cfg, self.state, self.prepared = cfg, state, prepared

    def __call__(self, index: int, shares: int) -> list[BlockResult]:
        blocks = share(pending(output(self.state)[self.prepared.name]), index, shares)
        use_allocation()
        scorer = Scorer(self.cfg.store.path, reducer_device(self.cfg), self.cfg.store.options)
        return [scorer.run_block(t) for t in blocks if not scorer.committed(t)]


class SerialJob:
    """A job of the chain's reducer stages: the state of the job before, the outputs of the
    arrays in between (``arrays``: name → result files), then ``ops`` (``fn(reducer, *args)``)
    in order. Returns the state with each op's output under its name (the ``last`` job: its
    last op's output)."""

    def __init__(
        self, cfg: JobConfig, state: Path | None, arrays: dict[str, list[Path]], ops: list[Op],
        last: bool,
    ) -> None:  # fmt: skip
        self.cfg, self.state, self.arrays, self.ops, self.last = cfg, state, arrays, ops, last

    def __call__(self) -> Any:
        use_allocation()
        state = {"phases": {}} if self.state is None else dict(output(self.state))
        for name, files in self.arrays.items():
            state[name] = [x for f in files for x in _as_list(output(f))]
        reducer = Reducer(self.cfg.store.path, reducer_device(self.cfg), self.cfg.store.options)
        try:
            for name, fn, args in self.ops:
                t0 = time.perf_counter()
                values = [state[a.name] if isinstance(a, Later) else a for a in args]
                state[name] = fn(reducer, *values)
                phase = PHASES.get(fn.__name__.strip("_"), "")
                state["phases"][phase] = state["phases"].get(phase, 0.0) + time.perf_counter() - t0
        except BaseException as e:
            reducer.stop_scores(discard=discards(e))  # the score step's rule
            raise
        reducer.stop_scores()  # a lease ends with its job: the next one adopts the scorings
        state["phases"].pop("", None)
        return state[self.ops[-1][0]] if self.last else state


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def _reduce(reducer: Reducer, ids: list[int], proj_dims: list[int]) -> Any:
    with store_lock(reducer.store.where, options=reducer.store.options):
        return reducer.reduce(ids, proj_dims)


def _prepare(reducer: Reducer, requests: list[ScoreRequest]) -> list[Any]:
    reducer.prepare_scores(requests)
    return reducer.hand_over()


def _finish(reducer: Reducer, requests: Any, results: Any, prepared: Any) -> Any:
    reducer.adopt(prepared)
    return reducer.finish_scores(requests, results)


def _call(reducer: Reducer, fn: Callable[..., Any], *args: Any) -> Any:
    return fn(*args)


class SlurmExecutor(Executor):
    """Submits the chain with ``ex`` (a submitit executor; ``local``: submitit's local one,
    which has no dependencies, so each submission waits for the one before); ``tasks``
    featurize tasks, ``score_tasks`` score tasks (at most one per block). The serial jobs are
    ``serial``, the arrays ``shards`` and ``scores``."""

    def __init__(self, ex: submitit.Executor, local: bool, tasks: int, score_tasks: int) -> None:
        self.ex, self.local, self.tasks, self.score_tasks = ex, local, tasks, score_tasks
        self.shards: list[submitit.Job[Any]] = []
        self.serial: list[submitit.Job[Any]] = []
        self.scores: list[submitit.Job[Any]] = []
        self._ops: list[Op] = []
        self._arrays: dict[str, list[Path]] = {}
        self._state: Path | None = None

    def start(self, cfg: JobConfig, prep: Prepared) -> None:
        self.cfg, self.prep = cfg, prep

    def featurize(self, cfg: JobConfig, prep: Prepared, on_shard: OnShard | None) -> Later:
        groups = split(prep.train_tasks + prep.target_tasks, self.tasks)
        if groups:
            self.shards = self.ex.map_array(ShardRunner(cfg, prep.checkpoints, prep.width), groups)
        return self._array("features", self.shards)

    def reduce(self, model_ids: list[int], proj_dims: list[int]) -> Later:
        return self._op(_reduce, model_ids, proj_dims)

    def scoring(self) -> SlurmExecutor:
        return self

    def prepare_scores(self, requests: list[ScoreRequest]) -> Later:
        p = self.prep
        plans = [
            ScorePlan.of(p.n, p.m, r.proj_dim or p.width, len(p.checkpoints), r.scoring,
                         p.store.spec.chunk_rows)
            for r in requests
        ]  # fmt: skip
        self._blocks = sum(len(q.row_ranges) * len(q.super_blocks) for q in plans)
        self._prepared = self._op(_prepare, requests)
        return self._prepared

    def run_blocks(self, tasks: Later) -> Later:
        state, shares = self._flush(), max(1, min(self.score_tasks, self._blocks))
        runner = ScoreRunner(self.cfg, state, self._prepared)
        self.scores = self.ex.map_array(runner, list(range(shares)), [shares] * shares)
        return self._array("blocks", self.scores)

    def finish_scores(self, requests: list[ScoreRequest], results: Later) -> Later:
        return self._op(_finish, requests, results, self._prepared)

    def stop_scores(self, discard: bool = False) -> None:
        """Nothing runs at submission: the serial jobs apply the score step's rule."""

    def conclude(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Later:
        """``fn(*args, phases)`` in the last job, with the phases the jobs measured."""
        return self._op(_call, fn, *args, Later("phases"))

    def then(self, fn: Callable[..., Any], *args: Any) -> submitit.Job[Any]:
        """``fn(*args)`` (``Later`` args resolved) in the last job, which it submits."""
        self._op(_call, fn, *args)
        self._flush(last=True)
        return self.serial[-1]

    def _op(self, fn: Callable[..., Any], *args: Any) -> Later:
        name = fn.__name__.strip("_")
        name = f"{name}{len(self._ops)}" if name == "call" else name
        self._ops.append((name, fn, args))
        return Later(name)

    def _array(self, name: str, jobs: list[submitit.Job[Any]]) -> Later:
        self._arrays[name] = [j.paths.result_pickle for j in jobs]
        self._wait_for(jobs)
        return Later(name)

    def _flush(self, last: bool = False) -> Path:
        """Submit the serial job built so far; returns its result file (the next state)."""
        job = self.ex.submit(SerialJob(self.cfg, self._state, self._arrays, self._ops, last))
        self.serial.append(job)
        self._ops, self._arrays, self._state = [], {}, job.paths.result_pickle
        self._wait_for([job])
        return self._state

    def _wait_for(self, jobs: list[submitit.Job[Any]]) -> None:
        """Make the next submission wait for ``jobs`` to succeed."""
        if self.local:
            for j in jobs:  # the local executor has no dependencies: wait here instead
                j.result()
            return
        ids = sorted({j.job_id.split("_")[0] for j in jobs})  # an array's tasks share its id
        extra = {"dependency": "afterok:" + ":".join(ids), "kill_on_invalid_dep": "yes"}
        self.ex.update_parameters(slurm_additional_parameters=extra if ids else {})
