"""The replica's batching: a lone request starts at once, requests arriving while a batch is
computed form the next one (at most max_size), a free worker waits only for as many requests as
its recent batches held, each gets its own result, and a failure reaches every request of its
batch without stopping the worker."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from trak_dist.serve._batcher import Batcher


def _slow_square(delay: float, started: threading.Event | None = None):
    def fn(items: list[int]) -> list[int]:
        if started is not None:
            started.set()
        time.sleep(delay)
        if any(i < 0 for i in items):
            raise ValueError(f"negative item in {items}")
        return [i * i for i in items]

    return fn


def test_lone_request_is_not_delayed():
    async def main():
        batcher = Batcher(_slow_square(0.0), max_size=16, wait_s=0.0)
        t0 = time.perf_counter()
        assert await batcher.submit(7) == 49
        return time.perf_counter() - t0, batcher.sizes

    took, sizes = asyncio.run(main())
    assert sizes == [1]
    assert took < 0.5  # no timer to wait out (Serve's batch waited batch_wait_timeout_s)


def test_requests_arriving_during_a_batch_form_the_next():
    async def main():
        started = threading.Event()
        batcher = Batcher(_slow_square(0.3, started), max_size=4, wait_s=0.0)
        first = asyncio.create_task(batcher.submit(1))
        while not started.is_set():  # the first batch is being computed ...
            await asyncio.sleep(0.005)
        rest = [asyncio.create_task(batcher.submit(i)) for i in range(2, 8)]  # ... 6 arrive
        return await asyncio.gather(first, *rest), batcher.sizes

    results, sizes = asyncio.run(main())
    assert results == [i * i for i in range(1, 8)]
    assert sizes == [1, 4, 2]  # max_size caps the second batch; the rest go next


def test_wait_gathers_a_batch_when_idle():
    async def main():
        batcher = Batcher(_slow_square(0.0), max_size=8, wait_s=0.2)
        tasks = []
        for i in range(3):
            tasks.append(asyncio.create_task(batcher.submit(i)))
            await asyncio.sleep(0.02)
        return await asyncio.gather(*tasks), batcher.sizes

    results, sizes = asyncio.run(main())
    assert results == [0, 1, 4]
    assert sizes == [3]


def test_clients_arriving_one_by_one_are_gathered_into_one_batch():
    """Clients that wait for their replies send again one by one: after batches of more than
    one, a free worker waits (up to wait_s) for more instead of starting on the first."""

    async def main():
        batcher = Batcher(_slow_square(0.0), max_size=4, wait_s=0.5)
        await asyncio.gather(*[batcher.submit(i) for i in range(4)])
        t0 = time.perf_counter()
        tasks = []
        for i in range(4):
            tasks.append(asyncio.create_task(batcher.submit(i)))
            await asyncio.sleep(0.02)
        results = await asyncio.gather(*tasks)
        return results, time.perf_counter() - t0, batcher.sizes

    results, took, sizes = asyncio.run(main())
    assert results == [0, 1, 4, 9]
    assert sizes == [4, 4]  # without the wait: [4, 1, 3] or the like
    assert took < 0.4  # max_size arrived after ~60 ms: no need to wait out the 0.5 s


def test_a_lone_client_does_not_wait_out_the_batch_wait():
    async def main():
        batcher = Batcher(_slow_square(0.0), max_size=16, wait_s=0.5)
        for _ in range(Batcher.RECENT):  # no history yet: these wait for more
            await batcher.submit(1)
        took = []
        for i in range(5):
            t0 = time.perf_counter()
            assert await batcher.submit(i) == i * i
            took.append(time.perf_counter() - t0)
        return took, batcher.sizes

    took, sizes = asyncio.run(main())
    assert sizes == [1] * (Batcher.RECENT + 5)
    assert max(took) < 0.3  # batches of 1: nothing to wait for


def test_a_failing_batch_fails_its_requests_and_the_worker_goes_on():
    async def main():
        started = threading.Event()
        batcher = Batcher(_slow_square(0.2, started), max_size=8, wait_s=0.0)
        first = asyncio.create_task(batcher.submit(2))
        while not started.is_set():
            await asyncio.sleep(0.005)
        bad = [asyncio.create_task(batcher.submit(i)) for i in (3, -1)]
        out = await asyncio.gather(*bad, return_exceptions=True)
        return await first, out, await batcher.submit(5)

    first, out, after = asyncio.run(main())
    assert first == 4 and after == 25
    for e in out:
        assert isinstance(e, ValueError) and "negative item in [3, -1]" in str(e)


@pytest.mark.parametrize("clients", [1, 16])
def test_every_request_gets_its_own_result(clients: int):
    async def main():
        batcher = Batcher(_slow_square(0.01), max_size=5, wait_s=0.0)
        return await asyncio.gather(*(batcher.submit(i) for i in range(clients * 3)))

    assert asyncio.run(main()) == [i * i for i in range(clients * 3)]
