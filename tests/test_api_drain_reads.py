"""``until_drained``: a stream's reads end with ``Drained`` at the drain's expiry, and only then."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from ninfer.api.gate import Drain, Drained, until_drained


async def _slow(log: list[str], n: int = 3, gap: float = 0.0, stall: float = 30.0) -> AsyncIterator[int]:
    try:
        for i in range(n):
            await asyncio.sleep(gap)
            yield i
        await asyncio.sleep(stall)
        yield n
    except asyncio.CancelledError:
        log.append("cancelled")
        raise
    finally:
        log.append("closed")


def test_expiry_while_waiting_raises_drained_and_closes_the_stream() -> None:
    async def run() -> tuple[list[int], list[str]]:
        drain, log, got = Drain(0.0), [], []
        asyncio.get_running_loop().call_later(0.05, drain.expire)
        with pytest.raises(Drained):
            async for ev in until_drained(_slow(log), drain):
                got.append(ev)
        assert not asyncio.current_task().cancelling()  # the drain's cancellation is not left on the task
        await asyncio.sleep(0)  # still runnable: nothing pending
        return got, log

    got, log = asyncio.run(run())
    assert got == [0, 1, 2] and log == ["cancelled", "closed"]


def test_expiry_between_reads_raises_drained_at_the_next_read() -> None:
    async def run() -> list[int]:
        drain, got = Drain(0.0), []
        with pytest.raises(Drained):
            async for ev in until_drained(_slow([], stall=0.0), drain):
                got.append(ev)
                if ev == 1:
                    drain.expire()  # while the consumer holds an event
        return got

    assert asyncio.run(run()) == [0, 1]


def test_expired_before_the_first_read() -> None:
    async def run() -> None:
        drain = Drain(0.0)
        drain.expire()
        with pytest.raises(Drained):
            async for _ in until_drained(_slow([]), drain):
                pass

    asyncio.run(run())


def test_the_callers_cancellation_stays_a_cancellation() -> None:
    async def run() -> list[str]:
        drain, log = Drain(0.0), []

        async def consume() -> None:
            async for _ in until_drained(_slow(log), drain):
                pass

        task = asyncio.ensure_future(consume())
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        drain.expire()  # afterwards: nothing left registered to cancel
        assert not drain._waits
        return log

    assert asyncio.run(run()) == ["cancelled", "closed"]


def test_a_stream_that_ends_normally() -> None:
    async def run() -> list[int]:
        drain = Drain(0.0)

        async def three() -> AsyncIterator[int]:
            for i in range(3):
                yield i

        out = [ev async for ev in until_drained(three(), drain)]
        assert not drain._waits
        return out

    assert asyncio.run(run()) == [0, 1, 2]
