"""The attempt tracker against the real Postgres and Redis: progress flushing, a cancel flagged
before the start, and what a re-run may do with the event stream."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import aiohttp
import pytest
from redis.asyncio import Redis
from sqlalchemy import event, text
from sqlalchemy.engine import RowMapping
from sqlalchemy.ext.asyncio import AsyncEngine

from director.attempts import Attempt
from director.execution import RERUN_AFTER_OUTPUT, Execution
from director.leases import Lease
from director.metrics import DirectorMetrics
from director.outcomes import record
from director.queue import Entry
from director.runner_monitor import RunnerMonitor
from protocol.client import RunnerClient
from tests.fixtures.fences import Unfenced
from tests.fixtures.predictions import inserted_prediction
from tests.fixtures.waiting import apace
from tracker import attempt_writes, store
from tracker.batch_writes import StateWrites
from tracker.events import EventLog, EventType, events_key
from tracker.publishing import Publishing
from tracker.render import PredictionLinks
from tracker.tracker import AttemptTracker

INTERVAL = 0.2


@pytest.fixture
async def events(redis_url: str) -> AsyncIterator[EventLog]:
    redis = Redis.from_url(redis_url)
    yield EventLog(redis)
    await redis.aclose()


class WriteCounter:
    """Counts the progress writes (``save_progress``) the engine sends to Postgres."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.count = 0
        self.engine = engine
        event.listen(engine.sync_engine, "before_cursor_execute", self._seen)

    def _seen(self, *args: Any) -> None:
        statement: str = args[2]
        if statement.startswith("UPDATE predictions SET output="):
            self.count += 1

    def remove(self) -> None:
        event.remove(self.engine.sync_engine, "before_cursor_execute", self._seen)


@pytest.fixture
def writes(engine: AsyncEngine) -> Iterator[WriteCounter]:
    counter = WriteCounter(engine)
    yield counter
    counter.remove()


async def eventually(probe: Callable[[], Any], what: str, timeout: float) -> float:
    """Await ``probe()`` until truthy; returns the seconds it took."""
    started = time.monotonic()
    while not await probe():
        if time.monotonic() - started > timeout:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await apace(0.01)
    return time.monotonic() - started


async def _claimed(engine: AsyncEngine, pid: str | None = None) -> RowMapping:
    """A new claim of ``pid`` (a new prediction without it), always by the same director
    name: a director restarted after a crash keeps its name."""
    pid = pid or await inserted_prediction(engine)
    row = await attempt_writes.claim(engine, pid, "director-a")
    assert row is not None
    return row


def _tracker(engine: AsyncEngine, row: RowMapping, events: EventLog) -> AttemptTracker:
    writes = StateWrites(engine)
    return AttemptTracker(
        writes,
        row,
        Publishing(events, PredictionLinks("http://conduit.test"), Unfenced()),
        INTERVAL,
    )


def _persisted(engine: AsyncEngine, pid: str, output: list[str]) -> Callable[[], Any]:
    async def probe() -> bool:
        row = await store.get(engine, pid)
        return row is not None and row["output"] == output

    return probe


async def test_a_burst_of_snapshots_costs_few_writes_and_the_last_lands(
    engine: AsyncEngine, events: EventLog, writes: WriteCounter
) -> None:
    row = await _claimed(engine)
    tracker = _tracker(engine, row, events)
    assert await tracker.started()
    output: list[str] = []
    started = time.monotonic()
    for i in range(50):
        output = [*output, f"t{i}"]
        await tracker.progress(output, "".join(f"line {n}\n" for n in range(i + 1)))
        await apace(0.02)  # a model yielding a token every 20 ms
    burst = time.monotonic() - started
    took = await eventually(_persisted(engine, row["id"], output), "the last snapshot", 5)
    assert took <= INTERVAL + 0.3
    assert 1 <= writes.count <= burst / INTERVAL + 2, (writes.count, burst)
    stored = await store.get(engine, row["id"])
    assert stored is not None and stored["logs"].endswith("line 49\n")
    await tracker.close()


async def test_a_snapshot_arriving_during_a_write_is_flushed_without_another(
    engine: AsyncEngine, events: EventLog, writes: WriteCounter
) -> None:
    row = await _claimed(engine)
    tracker = _tracker(engine, row, events)
    assert await tracker.started()
    async with engine.connect() as blocker:
        # Hold the row lock so the first progress write waits inside Postgres.
        await blocker.execute(
            text("SELECT 1 FROM predictions WHERE id = :id FOR UPDATE"), {"id": row["id"]}
        )
        await tracker.progress(["a"], None)

        async def writing() -> bool:
            return writes.count == 1

        await eventually(writing, "the first write to be on its way", 5)
        await tracker.progress(["a", "b"], None)  # arrives while that write waits
        await blocker.commit()
    await eventually(_persisted(engine, row["id"], ["a", "b"]), "the later snapshot", 3)
    assert writes.count == 2
    await tracker.close()


async def test_start_sees_a_cancel_flagged_after_the_claim(
    engine: AsyncEngine, events: EventLog
) -> None:
    flagged = await _claimed(engine)
    assert (await store.request_cancel(engine, flagged["account_id"], flagged["id"]))[0]
    tracker = _tracker(engine, flagged, events)
    assert await tracker.started()
    assert tracker.cancel_requested

    plain = _tracker(engine, await _claimed(engine), events)
    assert await plain.started()
    assert not plain.cancel_requested


async def _stream(events: EventLog, pid: str) -> list[tuple[EventType, str]]:
    return [(e.type, e.data) for e in await events.read(pid, "0", block_ms=None, count=10_000)]


async def _rerun(engine: AsyncEngine, pid: str, events: EventLog) -> RowMapping | None:
    """What a director does with a prediction whose run was lost: claim it again, reset it,
    and hand it to an execution (whose runner is never reached when it may not run again)."""
    row = await _claimed(engine, pid)
    reset = await attempt_writes.reset_for_rerun(engine, pid, row["attempt"])
    assert reset is not None
    tracker = _tracker(engine, reset, events)
    async with aiohttp.ClientSession() as session:
        runner = RunnerClient("http://127.0.0.1:9", session)  # discard port: nobody answers
        execution = Execution(
            runner=runner,
            tracker=tracker,
            attempt=Attempt(Entry("input:prediction:{dp-t/t}:0", "0-1", pid), Lease(pid)),
            webhook="http://127.0.0.1:9/runner",
            timeout=0.5,
            cancel_grace=0.1,
            monitor=RunnerMonitor(runner, 1.0, 1),
            metrics=DirectorMetrics(),
        )
        try:
            decided = await execution.run({})
            return await record(tracker, decided) if decided is not None else None
        finally:
            await tracker.close()


async def test_a_rerun_after_streamed_output_fails_instead_of_streaming_twice(
    engine: AsyncEngine, events: EventLog
) -> None:
    first = await _claimed(engine)
    lost = _tracker(engine, first, events)
    assert await lost.started()
    await lost.progress(["lost-0", "lost-1"], "working\n")
    await lost.close()  # the director died here

    second = _tracker(engine, await _claimed(engine, first["id"]), events)
    assert await second.earlier_output()

    row = await _rerun(engine, first["id"], events)
    assert row is not None and row["status"] == "failed" and row["error"] == RERUN_AFTER_OUTPUT
    stream = await _stream(events, first["id"])
    outputs = [data for kind, data in stream if kind is EventType.OUTPUT]
    assert outputs == ["lost-0", "lost-1"]  # nothing of a second run
    assert stream[-1][0] is EventType.DONE and (EventType.STATUS, "failed") in stream


async def test_a_rerun_with_no_streamed_output_runs_again(
    engine: AsyncEngine, events: EventLog
) -> None:
    first = await _claimed(engine)
    lost = _tracker(engine, first, events)
    assert await lost.started()
    await lost.progress(None, "loading weights\n")  # logs only, no output yet
    await lost.close()

    row = await _rerun(engine, first["id"], events)
    # It ran again: the execution went to the (absent) runner and hit its 0.5 s limit there.
    assert row is not None and row["status"] == "failed"
    assert row["error"] != RERUN_AFTER_OUTPUT and "timed out" in row["error"]


async def test_has_output_pages_through_a_long_stream(events: EventLog) -> None:
    pid = "p-" + str(time.monotonic_ns())
    await events.append(pid, [(EventType.LOGS, f"l{i}") for i in range(25)])
    assert not await events.has_output(pid, page=10)
    await events.append(pid, [(EventType.OUTPUT, "x")])
    assert await events.has_output(pid, page=10)
    assert not await events.has_output("p-none")
    await events.redis.delete(events_key(pid))
