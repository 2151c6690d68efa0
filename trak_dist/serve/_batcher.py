"""Batching of concurrent requests: whatever waits when the worker is free goes in one batch.

Ray Serve's ``@serve.batch`` closes a batch ``batch_wait_timeout_s`` after its first request and
then queues it behind the batch being computed, so requests arriving during a 300 ms pass over
the index wait for the next-but-one pass, and under 16 concurrent clients its batches held 1-7
requests (benchmarks/serve_load.py). Here the next batch is formed only when the worker is free:
a busy worker takes every request that arrived while it computed, up to ``max_size``, in one
call. A free worker waits (at most ``wait_s``) for ``max_size`` requests unless its last
``RECENT`` batches held one request each: clients that wait for their reply send the next
request only after it, so 16 such clients' requests reach a free worker one by one, and starting
on the first of them split every round into a small and a large pass over the index (1M rows,
16 clients: ~50 targets/s without the wait, ~70 with 20 ms). A lone client never waits.
Plain asyncio; no Ray.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")


class Batcher(Generic[T, R]):
    """Calls ``fn`` on batches of submitted items in a worker thread, one batch at a time.

    Args:
        fn: items → one result per item, in order (a result may be an exception object; one
            raised fails every item of its batch).
        max_size: most items per call.
        wait_s: how long a batch smaller than ``max_size`` waits for more items before the
            call, unless the last ``RECENT`` batches held one item each (0: never; the queue of
            a busy worker batches anyway).
    """

    RECENT = 3

    def __init__(self, fn: Callable[[list[T]], Sequence[R]], max_size: int, wait_s: float) -> None:
        self.fn = fn
        self.max_size = max_size
        self.wait_s = wait_s
        self.sizes: list[int] = []  # the size of every batch so far (for tests and benchmarks)
        self._queue: list[tuple[T, asyncio.Future[R]]] = []
        self._arrived = asyncio.Event()
        self._worker: asyncio.Task[None] | None = None

    async def submit(self, item: T) -> R:
        """``fn``'s result for ``item``, computed in a batch with the items waiting with it."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[R] = loop.create_future()
        self._queue.append((item, future))
        self._arrived.set()
        if self._worker is None or self._worker.done():
            self._worker = loop.create_task(self._run())
        return await future

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            while not self._queue:
                self._arrived.clear()
                await self._arrived.wait()
            recent = self.sizes[-self.RECENT :]
            lone = len(recent) == self.RECENT and max(recent) == 1
            want = 1 if lone else self.max_size
            deadline = loop.time() + self.wait_s
            while len(self._queue) < want and loop.time() < deadline:
                self._arrived.clear()
                try:
                    await asyncio.wait_for(self._arrived.wait(), deadline - loop.time())
                except TimeoutError:
                    break
            batch, self._queue = self._queue[: self.max_size], self._queue[self.max_size :]
            # a request whose client went away is cancelled: not worth computing
            batch = [(item, f) for item, f in batch if not f.done()]
            if not batch:
                continue
            self.sizes.append(len(batch))
            try:
                results = await asyncio.to_thread(self.fn, [item for item, _ in batch])
            except Exception as e:  # every waiting request hears of it; the worker goes on
                for _, f in batch:
                    if not f.done():
                        f.set_exception(e)
                continue
            for (_, f), r in zip(batch, results, strict=True):
                if not f.done():
                    f.set_result(r)
