"""BatchWaiter: batched calls awaited on an event loop through an eventfd (server/batch_waiter.py).

Fake calls stand for ``processor.batching.batched_call.BatchedCall``; the test plays the batch thread: it
marks a ticket done and adds 1 to the waiter's eventfd, as ``native/src/batcher.cc`` does.
"""

from __future__ import annotations

import asyncio
import os
import threading

import pytest

from server.batch_waiter import BatchWaiter


class Ticket:
    def __init__(self) -> None:
        self.done = False


class Call:
    def __init__(self, answer: str) -> None:
        self.ticket = Ticket()
        self.answer = answer
        self.results = self.releases = 0

    def result(self) -> str:
        self.results += 1
        return self.answer

    def release(self) -> None:
        self.releases += 1


def answer(waiter: BatchWaiter, *calls: Call) -> None:
    """The batch thread's part: tickets done, then the eventfd written."""
    for call in calls:
        call.ticket.done = True
    os.eventfd_write(waiter.fd, len(calls))


def test_each_caller_gets_its_answer_once_its_ticket_is_done():
    async def scenario():
        waiter = BatchWaiter(asyncio.get_running_loop())
        first, second, ready = Call("a"), Call("b"), Call("c")
        ready.ticket.done = True  # answered before anyone waited: no wake-up needed
        assert await waiter.result(ready) == "c"
        tasks = [asyncio.ensure_future(waiter.result(c)) for c in (first, second)]
        await asyncio.sleep(0.01)
        assert waiter.pending == 2
        threading.Thread(target=answer, args=(waiter, second)).start()  # from another thread
        assert await tasks[1] == "b"
        assert not tasks[0].done() and waiter.pending == 1
        answer(waiter, first)
        assert await tasks[0] == "a"
        assert waiter.pending == 0
        assert (first.results, first.releases, second.results, second.releases) == (1, 0, 1, 0)
        waiter.close()
    asyncio.run(scenario())


def test_a_cancelled_caller_releases_its_call_once_the_batch_ran():
    """The queue reads the request until its batch ran: released then, not at the cancel."""
    async def scenario():
        waiter = BatchWaiter(asyncio.get_running_loop())
        call, other = Call("a"), Call("b")
        task = asyncio.ensure_future(waiter.result(call))
        waiting = asyncio.ensure_future(waiter.result(other))
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert call.releases == 0 and waiter.pending == 2  # still queued natively
        answer(waiter, other)  # another batch: the orphan's ticket is not done yet
        assert await waiting == "b"
        assert call.releases == 0
        answer(waiter, call)
        for _ in range(100):
            if call.releases:
                break
            await asyncio.sleep(0.01)
        assert (call.releases, call.results) == (1, 0) and waiter.pending == 0
        waiter.close()
    asyncio.run(scenario())


def test_close_from_another_thread_stops_watching_and_closes_the_fd():
    async def scenario():
        waiter = BatchWaiter(asyncio.get_running_loop())
        fd = waiter.fd
        await asyncio.get_running_loop().run_in_executor(None, waiter.close)
        await asyncio.sleep(0.01)
        with pytest.raises(OSError):
            os.fstat(fd)
    asyncio.run(scenario())


def test_close_keeps_the_fd_open_while_a_call_is_still_queued():
    """A batch thread writes the fd once the call is answered: closing it first could write
    into whatever file gets its number next."""
    async def scenario():
        waiter = BatchWaiter(asyncio.get_running_loop())
        call, done = Call("a"), Call("b")
        for c in (call, done):
            task = asyncio.ensure_future(waiter.result(c))
            await asyncio.sleep(0.01)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        done.ticket.done = True
        waiter.close()
        assert done.releases == 1 and call.releases == 0  # the answered one released at close
        os.fstat(waiter.fd)  # still open: the queued one's batch thread will write it
        call.ticket.done = True
        os.close(waiter.fd)
    asyncio.run(scenario())
