"""The SLURM executor: ``run_pipeline``'s stages as a chain of SLURM jobs, submitted at once
(submitit), each waiting for the one before it (``afterok``; with ``--kill-on-invalid-dep`` a
failed or cancelled job cancels what waits for it, never left pending for ever):

    featurize          an array: each task featurises a contiguous group of shards with the
                       plain Worker (``ShardRunner``; requeued on preemption, it skips the
                       chunks it committed, and a rerun plans only uncommitted ones)
    reduce, prepare    one job: XᵀX from the committed rows, factors, each variant's Y, plan
                       and blocks still to run
    score blocks       an array: each task runs a contiguous share of the blocks (``ScoreRunner``)
    finish             one job: merge, publish, the run's result (and what the launcher adds)

The driver calls the same stages as every executor; here they return ``Later`` values, names
in the state that each serial job extends and returns (its submitit result file). A job cannot
hold a submitit Job (the local executor's does not pickle): it reads those files."""

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
    BlockScorer,
    Executor,
    FeaturizeReport,
    OnShard,
    Prepared,
    Reducer,
    ShardTask,
    Worker,
    reducer_device,
)
from trak_dist.scoring import BlockResult, BlockTask, ScorePlan, ScoreRequest, ScoreResult, discards
from trak_dist.store import store_lock


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
    """``parts`` contiguous groups of about equal rows (contiguous: a group mostly stays on one
    checkpoint, so its worker loads it and generates its projection once)."""
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
    """The blocks of the scorings the reduce job prepared (``Scorer.hand_over``)."""
    return [t for ref in prepared for t in ref.pending]


class ShardRunner(submitit.helpers.Checkpointable):
    """One featurize task. On preemption or time-out submitit requeues it with the same shards;
    the Worker then skips the chunks committed before the interruption."""

    def __init__(self, cfg: JobConfig, checkpoints: list[Path], width: int) -> None:
        self.cfg, self.checkpoints, self.width = cfg, checkpoints, width

    def __call__(self, tasks: list[ShardTask]) -> FeaturizeReport:
        worker = Worker(self.cfg, self.checkpoints, self.width)
        report = FeaturizeReport()
        for task in tasks:
            result, _ = worker.run(task)  # the reduce job sums XᵀX from the committed rows
            report.rows_computed[task.kind] += result.rows_computed
            report.rows_reused[task.kind] += result.rows_reused
        return report


class ScoreRunner(submitit.helpers.Checkpointable):
    """One score task: share ``index`` of ``shares`` of the blocks the reduce job prepared.
    Committed blocks are skipped, so a requeued task (or a rerun of the launch, whose reduce
    job plans only uncommitted blocks) redoes none."""

    def __init__(self, cfg: JobConfig, state: Path, prepared: Later) -> None:
        self.cfg, self.state, self.prepared = cfg, state, prepared

    def __call__(self, index: int, shares: int) -> list[BlockResult]:
        blocks = share(pending(output(self.state)[self.prepared.name]), index, shares)
        use_allocation()
        scorer = BlockScorer(self.cfg.store.path, reducer_device(self.cfg))
        return [scorer.run(t) for t in blocks if not scorer.committed(t)]


Op = tuple[str, Callable[..., Any], tuple[Any, ...]]
# the run report's phases, as the jobs measured them (the submitting process only plans)
PHASES = {"reduce": "reduce", "prepare": "score", "finish": "score"}


class SerialJob:
    """One job of the chain's reducer stages: the state the job before returned, the outputs of
    the arrays in between (``arrays``: name → result files), then ``ops`` in order; returns the
    state with every op's output under its name (the ``last`` job: its last op's output)."""

    def __init__(
        self,
        cfg: JobConfig,
        state: Path | None,
        arrays: dict[str, list[Path]],
        ops: list[Op],
        last: bool = False,
    ) -> None:
        self.cfg, self.state, self.arrays, self.ops, self.last = cfg, state, arrays, ops, last

    def __call__(self) -> dict[str, Any]:
        use_allocation()
        state = {} if self.state is None else dict(output(self.state))
        for name, files in self.arrays.items():
            state[name] = [x for f in files for x in _as_list(output(f))]
        reducer = Reducer(self.cfg.store.path, reducer_device(self.cfg))
        phases = state.setdefault("phases", {})
        try:
            for name, fn, args in self.ops:
                t0 = time.perf_counter()
                values = [state[a.name] if isinstance(a, Later) else a for a in args]
                state[name] = fn(reducer, *values)
                phase = PHASES.get(fn.__name__.strip("_"))
                if phase:
                    phases[phase] = phases.get(phase, 0.0) + time.perf_counter() - t0
        except BaseException as e:
            reducer.stop_scores(discard=discards(e))  # the score step's rule
            raise
        reducer.stop_scores()  # leases end with the job: the next one adopts the scorings
        return state[self.ops[-1][0]] if self.last else state


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def _reduce(reducer: Reducer, ids: list[int], proj_dims: list[int]) -> dict[int, dict[int, float]]:
    with store_lock(reducer.store.where):
        return reducer.reduce(ids, proj_dims)


def _prepare(reducer: Reducer, requests: list[ScoreRequest]) -> list[Any]:
    reducer.prepare_scores(requests)
    return reducer.hand_over()


def _finish(
    reducer: Reducer, requests: list[ScoreRequest], results: list[BlockResult], prepared: list[Any]
) -> list[ScoreResult]:
    reducer.adopt(prepared)
    return reducer.finish_scores(requests, results)


def _call(reducer: Reducer, fn: Callable[..., Any], *args: Any) -> Any:
    return fn(*args)


class SlurmExecutor(Executor):
    """Submits the stages as the chain above with ``ex`` (a submitit executor; ``local``: the
    local executor, which has no dependencies, so each submission waits for the one before).
    ``tasks`` featurize tasks, ``score_tasks`` score tasks (at most one per block)."""

    def __init__(self, ex: submitit.Executor, local: bool, tasks: int, score_tasks: int) -> None:
        self.ex, self.local, self.tasks, self.score_tasks = ex, local, tasks, score_tasks
        self.shards: list[submitit.Job[Any]] = []
        self.serial: list[submitit.Job[Any]] = []
        self.scores: list[submitit.Job[Any]] = []
        self._ops: list[Op] = []
        self._after: list[submitit.Job[Any]] = []
        self._arrays: dict[str, list[Path]] = {}
        self._state: Path | None = None
        self._names: dict[str, int] = {}

    def start(self, cfg: JobConfig, prep: Prepared) -> None:
        self.cfg, self.prep = cfg, prep

    def featurize(self, cfg: JobConfig, prep: Prepared, on_shard: OnShard | None) -> Any:
        groups = split(prep.train_tasks + prep.target_tasks, self.tasks)
        if groups:
            runner = ShardRunner(cfg, prep.checkpoints, prep.width)
            self.shards = self.ex.map_array(runner, groups)
        return self._array("features", self.shards)

    def reduce(self, model_ids: list[int], proj_dims: list[int]) -> Any:
        return self._op(_reduce, model_ids, proj_dims)

    def scoring(self) -> SlurmExecutor:
        return self

    def prepare_scores(self, requests: list[ScoreRequest]) -> Any:
        self._requests = requests
        self._prepared = self._op(_prepare, requests)
        return self._prepared

    def run_blocks(self, tasks: Any) -> Any:
        state = self._flush()
        shares = max(1, min(self.score_tasks, self._blocks()))
        runner = ScoreRunner(self.cfg, state, self._prepared)
        self.scores = self.ex.map_array(runner, list(range(shares)), [shares] * shares)
        return self._array("blocks", self.scores)

    def finish_scores(self, requests: list[ScoreRequest], results: Any) -> Any:
        return self._op(_finish, requests, results, self._prepared)

    def stop_scores(self, discard: bool = False) -> None:
        """Nothing has run when the chain is submitted: the jobs apply the rule themselves."""

    def conclude(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, phases=…)`` in the last job, with the phases the jobs measured."""
        return self._op(_call, fn, *args, Later("phases"))

    def then(self, fn: Callable[..., Any], *args: Any) -> submitit.Job[Any]:
        """Add ``fn(*args)`` (``Later`` args resolved) to the last job and submit it."""
        self._op(_call, fn, *args)
        self._flush(last=True)
        return self.serial[-1]

    def _blocks(self) -> int:
        """How many score blocks the scorings have (their plans; the sizes only)."""
        p = self.prep
        count = 0
        for r in self._requests:
            plan = ScorePlan.of(p.n, p.m, r.proj_dim or p.width, len(p.checkpoints), r.scoring,
                                self.cfg.store.chunk_rows)  # fmt: skip
            count += len(plan.row_ranges) * len(plan.super_blocks)
        return count

    def _op(self, fn: Callable[..., Any], *args: Any) -> Later:
        """``fn(reducer, *args)`` in the serial job being built; its output's name."""
        name = fn.__name__.strip("_")
        self._names[name] = self._names.get(name, 0) + 1
        name = name if self._names[name] == 1 else f"{name}{self._names[name]}"
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
        # kill-on-invalid-dep: a cancelled or failed task cancels what waits for it
        extra = {"dependency": "afterok:" + ":".join(ids), "kill_on_invalid_dep": "yes"}
        self.ex.update_parameters(slurm_additional_parameters=extra if ids else {})
