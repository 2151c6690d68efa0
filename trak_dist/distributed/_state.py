"""What the driver tracks while it runs, and what it reports at the end."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from trak_dist.distributed._interrupt import CtrlC
from trak_dist.distributed._queue import TaskQueue
from trak_dist.distributed._tasks import ShardTask


@dataclass
class JobResult:
    """What a run did: where results are, how long each phase took, what was reused."""

    store: str
    exp: str
    n: int
    m: int
    checkpoints: int
    proj_dim: int
    scores: list[dict[str, Any]]
    phases: dict[str, float]
    rows_computed: dict[str, int]
    rows_reused: dict[str, int]
    worker_restarts: int
    task_retries: int
    conditioning: dict[int, dict[int, float]]


@dataclass
class DriverState:
    pending: TaskQueue
    workers: list[Any] = field(default_factory=list)
    idle: deque[int] = field(default_factory=deque)
    inflight: dict[Any, tuple[ShardTask, int, Any]] = field(default_factory=dict)
    starting: dict[Any, int] = field(default_factory=dict)
    last_progress: float = field(default_factory=time.perf_counter)
    first_ready: float | None = None
    train_left: dict[int, int] = field(default_factory=dict)
    finish_refs: list[Any] = field(default_factory=list)
    rows_computed: dict[str, int] = field(default_factory=lambda: {"train": 0, "target": 0})
    rows_reused: dict[str, int] = field(default_factory=lambda: {"train": 0, "target": 0})
    restarts: int = 0
    retries: int = 0
    ctrl_c: CtrlC = field(default_factory=CtrlC)
