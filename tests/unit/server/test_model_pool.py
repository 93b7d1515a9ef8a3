"""ModelPool: a model's threads and the bound on requests waiting for them (server/model_pool.py)."""

from __future__ import annotations

import asyncio
import contextvars
import threading

import pytest

from processor.errors import StatusCode
from server.model_pool import ModelPool, QueueFull

var = contextvars.ContextVar("var", default="unset")


def test_the_queue_bound_refuses_one_more_at_once_and_frees_as_work_ends():
    release = threading.Event()

    async def scenario():
        pool = ModelPool("m", threads=2, max_queued=1)
        admitted = [asyncio.ensure_future(pool.run(release.wait, 10)) for _ in range(3)]  # 2 run, 1 waits
        await asyncio.sleep(0)
        assert pool.pending == 3
        with pytest.raises(QueueFull) as err:
            await pool.run(release.wait, 10)
        assert err.value.code == StatusCode.UNAVAILABLE and err.value.retry_after == 1
        assert "max_queued_requests 1" in err.value.message and "model m" in err.value.message
        assert pool.pending == 3  # the refusal took no place
        release.set()
        assert await asyncio.gather(*admitted) == [True] * 3
        assert pool.pending == 0
        assert await pool.run(lambda: 7) == 7  # room again
        pool.shutdown()
    asyncio.run(scenario())


def test_without_a_bound_every_request_waits():
    release = threading.Event()

    async def scenario():
        pool = ModelPool("m", threads=1)
        admitted = [asyncio.ensure_future(pool.run(release.wait, 10)) for _ in range(50)]
        await asyncio.sleep(0)
        assert pool.pending == 50
        release.set()
        assert all(await asyncio.gather(*admitted))
        pool.shutdown()
    asyncio.run(scenario())


def test_a_cancelled_caller_keeps_its_place_until_its_work_ends():
    """The drain timeout cancels a waiting caller; its work still runs on a thread, so it still
    counts against the queue until it ends."""
    started, release = threading.Event(), threading.Event()

    def work():
        started.set()
        return release.wait(10)

    async def scenario():
        pool = ModelPool("m", threads=1, max_queued=0)
        task = asyncio.ensure_future(pool.run(work))
        while not started.is_set():
            await asyncio.sleep(0.001)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert pool.pending == 1
        with pytest.raises(QueueFull):
            await pool.run(lambda: None)
        release.set()
        while pool.pending:
            await asyncio.sleep(0.001)
        pool.shutdown()
    asyncio.run(scenario())


def test_the_work_runs_in_the_callers_context():
    async def scenario():
        pool = ModelPool("m", threads=1)
        var.set("the request's")
        assert await pool.run(var.get) == "the request's"
        pool.shutdown()
    asyncio.run(scenario())
