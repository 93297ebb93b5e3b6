"""``X-Priority`` has one order, and every queue that orders by it serves in that order: a
runner's scheduler, the lane's bands and the pool host's wait queue (whose integer priority
grows with urgency, the other way round from a rank)."""

from __future__ import annotations

import asyncio

import pytest

from lane.events import band_of
from lane.queue import FairQueue
from protocol.values import Priority
from runners.pool.config import QueueMode
from runners.pool.queue import Waiter, WaitQueue
from runners.scheduler import Scheduler

#: Most urgent first: the order the contract promises.
URGENT_FIRST = [Priority.HIGH, Priority.NORMAL, Priority.LOW]
#: Arrival order that every queue must reorder.
ARRIVALS = [Priority.LOW, Priority.NORMAL, Priority.HIGH]


def test_rank_and_weight_derive_from_one_order() -> None:
    assert list(Priority) == URGENT_FIRST
    assert [p.rank for p in URGENT_FIRST] == [0, 1, 2]
    assert [p.weight for p in URGENT_FIRST] == [1, 0, -1]
    assert Priority.NORMAL.weight == 0  # the pool's default request and model priority


async def test_runner_scheduler_serves_high_first() -> None:
    scheduler = Scheduler(slots=1, max_queue_depth=10)
    holder = scheduler.admit(Priority.NORMAL)
    tickets = [scheduler.admit(p) for p in ARRIVALS]
    served: list[Priority] = []
    scheduler.release(holder)
    for _ in ARRIVALS:
        ticket = next(t for t in tickets if t.granted_at is not None and not t.released)
        await asyncio.wait_for(scheduler.acquire(ticket), 5)
        served.append(ticket.priority)
        scheduler.release(ticket)
    assert served == URGENT_FIRST


def test_lane_bands_serve_high_first() -> None:
    queue = FairQueue()
    for priority in ARRIVALS:
        queue.push(priority.value, "acct", band_of(priority))
    assert [queue.pop() for _ in ARRIVALS] == [p.value for p in URGENT_FIRST]


def test_pool_queue_serves_high_first() -> None:
    queue = WaitQueue(QueueMode.WARM, max_depth=10, starvation_after=60.0)
    for seq, priority in enumerate(ARRIVALS):
        queue.add(Waiter(priority.value, "m", None, priority.weight, 0.0, seq, None))
    assert [w.request_id for w in queue.ordered(now=1.0)] == [p.value for p in URGENT_FIRST]


@pytest.mark.parametrize("header", ["high", " HIGH ", "low", "normal", "bogus", None])
def test_pool_reads_the_header_on_the_contract_scale(header: str | None) -> None:
    priority = Priority.parse(header)
    assert priority.weight == {"high": 1, "normal": 0, "low": -1}[priority.value]
