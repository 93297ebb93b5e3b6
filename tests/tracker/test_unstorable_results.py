"""What a runner sends that Postgres or the event stream cannot hold never stalls a director:
NUL is escaped, output and logs past their caps or beyond JSON fail the prediction with an
explanation, a terminal write Postgres refuses is recorded as a failure, event streams are
capped, and only connection-level errors are retried."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from psycopg.errors import UntranslatableCharacter
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import OutOfMemoryError, ResponseError
from sqlalchemy.engine import RowMapping
from sqlalchemy.exc import DataError, IntegrityError, OperationalError
from sqlalchemy.ext.asyncio import AsyncEngine

from core.transient import TRANSIENT, persistently
from tests.fixtures.fences import Unfenced
from tests.fixtures.predictions import inserted_prediction
from tracker import attempt_writes
from tracker.batch_writes import StateWrites
from tracker.events import EventLog, EventType, events_key
from tracker.publishing import Publishing
from tracker.render import PredictionLinks
from tracker.run_output import Caps
from tracker.states import Status
from tracker.tracker import AttemptTracker, UnrecordableResult


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[Redis]:
    client = Redis.from_url(redis_url)
    yield client
    await client.aclose()


async def _tracker(
    engine: AsyncEngine, redis: Redis, caps: Caps | None = None, max_len: int = 100_000
) -> AttemptTracker:
    pid = await inserted_prediction(engine, "unstorable")
    row = await attempt_writes.claim(engine, pid, "director-u")
    assert row is not None
    events = EventLog(redis, max_len=max_len)
    publishing = Publishing(events, PredictionLinks("http://conduit.test"), fence=Unfenced())
    tracker = AttemptTracker(StateWrites(engine), row, publishing, 0.05, caps=caps)
    assert await tracker.started()
    return tracker


async def _events(redis: Redis, pid: str) -> list[tuple[EventType, str]]:
    events = await EventLog(redis).read(pid, "0", block_ms=None, count=100_000)
    return [(event.type, event.data) for event in events]


async def test_nul_in_output_logs_and_error_is_escaped(engine: AsyncEngine, redis: Redis) -> None:
    tracker = await _tracker(engine, redis)
    await tracker.progress(["a\x00b"], "one\x00\n")
    row = await tracker.finish(
        Status.FAILED,
        output=["a\x00b", {"k\x00": ["\x00"]}],
        logs="one\x00\ntwo\x00\n",
        error="boom\x00",
    )
    assert row is not None
    assert row["status"] == "failed" and row["error"] == "boom\\u0000"
    assert row["output"] == ["a\\u0000b", {"k\\u0000": ["\\u0000"]}]
    assert row["logs"] == "one\\u0000\ntwo\\u0000\n"
    events = await _events(redis, tracker.prediction_id)
    assert (EventType.OUTPUT, "a\\u0000b") in events
    assert events[-1][0] is EventType.DONE


async def test_output_past_its_cap_fails_the_prediction(engine: AsyncEngine, redis: Redis) -> None:
    tracker = await _tracker(engine, redis, Caps(output_bytes=100, log_bytes=1000))
    await tracker.progress(["x" * 40], None)
    assert tracker.refused is None
    await tracker.progress(["x" * 40, "y" * 80], None)
    assert tracker.refused is not None and "output passed the limit of 100 bytes" in tracker.refused
    row = await tracker.finish(Status.SUCCEEDED, output=["x" * 40, "y" * 80, "z"])
    assert row is not None and row["status"] == "failed"
    assert row["error"] == tracker.refused
    assert row["output"] == ["x" * 40]  # what came within the cap


async def test_logs_past_their_cap_fail_the_prediction(engine: AsyncEngine, redis: Redis) -> None:
    tracker = await _tracker(engine, redis, Caps(output_bytes=1000, log_bytes=10))
    row = await tracker.finish(Status.SUCCEEDED, output="fine", logs="0123456789abc\n")
    assert row is not None and row["status"] == "failed"
    assert "logs passed the limit of 10 bytes" in row["error"]
    assert row["logs"] == ""


async def test_output_beyond_json_fails_with_an_explanation(
    engine: AsyncEngine, redis: Redis
) -> None:
    tracker = await _tracker(engine, redis)
    row = await tracker.finish(Status.SUCCEEDED, output={"n": 2**70})
    assert row is not None and row["status"] == "failed"
    assert "64-bit" in row["error"]

    chunked = await _tracker(engine, redis)
    await chunked.progress(["ok", 2**70], None)
    assert chunked.refused is not None
    row = await chunked.finish(Status.FAILED, error=chunked.refused)
    assert row is not None and row["status"] == "failed" and "64-bit" in row["error"]


async def test_a_refused_terminal_write_is_recorded_as_a_failure(
    engine: AsyncEngine, redis: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    tracker = await _tracker(engine, redis)
    await tracker.progress(["kept"], "kept\n")
    real_finish = attempt_writes.finish
    calls: list[Status] = []

    async def refusing_once(*args: Any, **kwargs: Any) -> RowMapping | None:
        calls.append(args[3])
        if len(calls) == 1:
            raise DataError("UPDATE ...", {}, UntranslatableCharacter("cannot store that"))
        return await real_finish(*args, **kwargs)

    monkeypatch.setattr(attempt_writes, "finish", refusing_once)
    row = await tracker.finish(Status.SUCCEEDED, output=["kept", "more"], logs="kept\nmore\n")
    assert calls == [Status.SUCCEEDED, Status.FAILED]
    assert row is not None and row["status"] == "failed"
    assert row["error"].startswith("the result could not be recorded: UntranslatableCharacter")
    assert "UPDATE" not in row["error"]
    events = await _events(redis, tracker.prediction_id)
    assert events[-1][0] is EventType.DONE


async def test_a_refused_failure_is_unrecordable(
    engine: AsyncEngine, redis: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    tracker = await _tracker(engine, redis)

    async def refusing(*args: Any, **kwargs: Any) -> RowMapping | None:
        raise IntegrityError("INSERT ...", {}, Exception("constraint"))

    monkeypatch.setattr(attempt_writes, "finish", refusing)
    with pytest.raises(UnrecordableResult):
        await tracker.finish(Status.SUCCEEDED, output=["x"])


async def test_event_streams_are_capped(engine: AsyncEngine, redis: Redis) -> None:
    tracker = await _tracker(engine, redis, max_len=100)
    for i in range(30):
        logs = "".join(f"line {n}\n" for n in range((i + 1) * 20))
        await tracker.progress(None, logs)
    length = await redis.xlen(events_key(tracker.prediction_id))
    assert length < 600  # 20 lines per snapshot: trimmed to about 100 (whole nodes at a time)
    await tracker.finish(Status.SUCCEEDED, output="done")
    events = await _events(redis, tracker.prediction_id)
    assert events[-1][0] is EventType.DONE


async def test_only_connection_failures_are_transient() -> None:
    refused = DataError("SELECT", {}, UntranslatableCharacter("nul"))
    assert not isinstance(refused, TRANSIENT)
    assert not isinstance(IntegrityError("INSERT", {}, Exception("dup")), TRANSIENT)
    assert isinstance(OperationalError("SELECT", {}, Exception("closed")), TRANSIENT)
    assert isinstance(RedisConnectionError("gone"), TRANSIENT)
    assert isinstance(OutOfMemoryError("OOM command not allowed"), TRANSIENT)
    assert not isinstance(ResponseError("WRONGTYPE"), TRANSIENT)
    attempts = 0

    async def attempt() -> None:
        nonlocal attempts
        attempts += 1
        raise refused

    with pytest.raises(DataError):
        await persistently("a write Postgres refuses", attempt)
    assert attempts == 1
