"""Slots and the bounded priority queue, driven directly on an event loop."""

from __future__ import annotations

import asyncio

import pytest

from runners.errors import AtCapacityError, QueueFullError
from runners.scheduler import Priority, Scheduler


async def test_priority_order_and_fifo_within_a_priority() -> None:
    scheduler = Scheduler(slots=1, max_queue_depth=4)
    running = scheduler.admit(Priority.NORMAL)
    order: list[str] = []
    tickets = {
        name: scheduler.admit(priority)
        for name, priority in (
            ("low", Priority.LOW),
            ("normal-1", Priority.NORMAL),
            ("high", Priority.HIGH),
            ("normal-2", Priority.NORMAL),
        )
    }

    async def run(name: str) -> None:
        await scheduler.acquire(tickets[name])
        order.append(name)
        scheduler.release(tickets[name], ran_for=0.1)

    tasks = [asyncio.create_task(run(name)) for name in tickets]
    with pytest.raises(QueueFullError) as full:
        scheduler.admit(Priority.HIGH)
    assert full.value.retry_after >= 1
    assert scheduler.saturated and scheduler.depth == 4
    scheduler.release(running, ran_for=0.1)
    await asyncio.gather(*tasks)
    assert order == ["high", "normal-1", "normal-2", "low"]
    assert scheduler.in_use == 0 and not scheduler.saturated


async def test_cancel_while_queued_gives_the_place_up() -> None:
    scheduler = Scheduler(slots=1, max_queue_depth=1)
    running = scheduler.admit(Priority.NORMAL)
    queued = scheduler.admit(Priority.NORMAL)
    reached = asyncio.Event()

    async def wait_for_the_slot() -> None:
        reached.set()  # acquire runs on from here, without yielding, up to its await
        await scheduler.acquire(queued)

    waiter = asyncio.create_task(wait_for_the_slot())
    await reached.wait()
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert scheduler.depth == 0
    scheduler.release(running)
    assert scheduler.in_use == 0


def test_no_queue_means_cogs_409() -> None:
    async def main() -> None:
        scheduler = Scheduler(slots=1, max_queue_depth=0)
        scheduler.admit(Priority.NORMAL)
        with pytest.raises(AtCapacityError):
            scheduler.admit(Priority.HIGH)

    asyncio.run(main())


def test_priority_header_parsing() -> None:
    assert Priority.parse("HIGH") is Priority.HIGH
    assert Priority.parse(None) is Priority.NORMAL
    assert Priority.parse("urgent") is Priority.NORMAL
