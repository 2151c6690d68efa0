"""What the Ray driver tracks while it runs."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from trak_dist.distributed._interrupt import CtrlC
from trak_dist.distributed._queue import TaskQueue
from trak_dist.pipeline import ShardTask


@dataclass
class DriverState:
    pending: TaskQueue = field(default_factory=TaskQueue)
    workers: list[Any] = field(default_factory=list)
    idle: deque[int] = field(default_factory=deque)
    inflight: dict[Any, tuple[ShardTask, int, Any]] = field(default_factory=dict)
    starting: dict[Any, int] = field(default_factory=dict)
    last_progress: float = field(default_factory=time.perf_counter)
    first_ready: float | None = None
    partials: list[Any] = field(default_factory=list)
    rows_computed: dict[str, int] = field(default_factory=lambda: {"train": 0, "target": 0})
    rows_reused: dict[str, int] = field(default_factory=lambda: {"train": 0, "target": 0})
    ctrl_c: CtrlC = field(default_factory=CtrlC)
