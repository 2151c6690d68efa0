"""Pending shards, handed out with checkpoint affinity."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

from trak_dist.pipeline import ShardTask


class TaskQueue:
    """Pending shards per checkpoint, handed out with checkpoint affinity: a switch costs a
    reload and a regeneration of P, so a free worker keeps its checkpoint while it has shards,
    else takes the one fewest workers are on."""

    def __init__(self, tasks: list[ShardTask] | None = None) -> None:
        self._by_model: dict[int, deque[ShardTask]] = {}
        self._on: dict[int, int] = {}  # slot -> model_id of its last task
        for t in tasks or []:
            self._by_model.setdefault(t.model_id, deque()).append(t)

    def __bool__(self) -> bool:
        return bool(self._by_model)

    def __len__(self) -> int:
        return sum(len(q) for q in self._by_model.values())

    def __iter__(self) -> Iterator[ShardTask]:
        return (t for q in self._by_model.values() for t in q)

    def extend(self, tasks: list[ShardTask]) -> None:
        for t in tasks:
            self._by_model.setdefault(t.model_id, deque()).append(t)

    def push_front(self, task: ShardTask) -> None:
        self._by_model.setdefault(task.model_id, deque()).appendleft(task)

    def pop_for(self, slot: int) -> ShardTask:
        model = self._on.get(slot)
        if model not in self._by_model:
            load = {m: 0 for m in self._by_model}
            for s, m in self._on.items():
                if m in load and s != slot:
                    load[m] += 1
            model = min(load, key=lambda m: (load[m], m))
        queue = self._by_model[model]
        task = queue.popleft()
        if not queue:
            del self._by_model[model]
        self._on[slot] = model
        return task
