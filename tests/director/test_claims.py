"""Claims against the real Postgres and Redis: who may take a prediction another director
claimed, and what a re-run does when the row changed under it."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import orjson
import pytest
from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine

from director.claims import Claimed, Claims, Unclaimed
from director.queue import Entry, Queue, deployment_stream
from tests.fixtures.predictions import inserted_prediction
from tracker import attempt_writes, store
from tracker.batch_writes import StateWrites
from tracker.events import EventLog
from tracker.keys import alive_key
from tracker.ledger import Ledger
from tracker.render import PredictionLinks
from tracker.states import Status


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[Redis]:
    client: Redis = Redis.from_url(redis_url)
    yield client
    await client.aclose()


def _claims(redis: Redis, engine: AsyncEngine, consumer: str) -> Claims:
    return Claims(
        Ledger(StateWrites(engine)),
        Queue(redis),
        consumer,
        EventLog(redis),
        PredictionLinks("http://127.0.0.1"),
    )


def _entry(prediction_id: str) -> Entry:
    return Entry(deployment_stream("test/claims", 0), "1-0", prediction_id, 2)


async def _alive(redis: Redis, consumer: str, running: list[str]) -> None:
    """What a director's heartbeat publishes: alive, running these predictions."""
    await redis.set(alive_key(consumer), orjson.dumps(running), px=30_000)


async def _processing_on(engine: AsyncEngine, owner: str) -> str:
    """A prediction ``owner`` claimed and started."""
    pid = await inserted_prediction(engine)
    row = await attempt_writes.claim(engine, pid, owner)
    assert row is not None
    assert await attempt_writes.mark_processing(engine, pid, row["attempt"]) is not None
    return pid


async def test_an_entry_of_a_prediction_running_on_a_live_director_is_dropped(
    redis: Redis, engine: AsyncEngine
) -> None:
    owner = f"a-{uuid.uuid4().hex[:8]}"
    pid = await _processing_on(engine, owner)
    await _alive(redis, owner, [pid])
    assert await _claims(redis, engine, "b").claim(_entry(pid)) is Unclaimed.DROP
    row = await store.get(engine, pid)
    assert row is not None and row["claim_owner"] == owner and row["attempt"] == 1


async def test_a_live_director_that_does_not_run_it_gives_it_up(
    redis: Redis, engine: AsyncEngine
) -> None:
    """Its owner waits to retry it (its runner went away) and this director took the entry
    over, idle past the visibility timeout: dropping it would leave the prediction in no
    stream, to come back as a new entry whose deliveries count from one again."""
    owner = f"a-{uuid.uuid4().hex[:8]}"
    pid = await _processing_on(engine, owner)
    await _alive(redis, owner, ["something-else"])
    claim = await _claims(redis, engine, "b").claim(_entry(pid))
    assert isinstance(claim, Claimed)
    assert claim.row["claim_owner"] == "b" and claim.row["attempt"] == 2


async def test_a_rerun_whose_row_changed_is_left_not_failed(
    redis: Redis, engine: AsyncEngine
) -> None:
    """The row moved on between this attempt's claim and its re-run: another attempt owns it,
    so this one neither fails it as interrupted nor runs it."""
    pid = await _processing_on(engine, "a")
    claims = _claims(redis, engine, "b")
    claim = await claims.claim(_entry(pid))  # "a" is not alive: taken over
    assert isinstance(claim, Claimed)
    newer = await attempt_writes.claim(
        engine, pid, "c", ("b",)
    )  # and taken again before the re-run
    assert newer is not None

    assert await claims.rerun(claim.row, max_runs=5) is Unclaimed.LATER
    row = await store.get(engine, pid)
    assert row is not None and row["status"] == Status.PROCESSING.value
    assert row["attempt"] == newer["attempt"] and row["error"] is None

    ended = await attempt_writes.finish(engine, pid, newer["attempt"], Status.FAILED, error="gone")
    assert ended is not None
    assert await claims.rerun(claim.row, max_runs=5) is Unclaimed.DROP


async def test_a_rerun_within_the_bound_starts_over_and_past_it_is_refused(
    redis: Redis, engine: AsyncEngine
) -> None:
    pid = await _processing_on(engine, "a")
    claims = _claims(redis, engine, "b")
    claim = await claims.claim(_entry(pid))
    assert isinstance(claim, Claimed) and claim.row["runs"] == 1
    assert await claims.rerun(claim.row, max_runs=1) is None  # no run left: fail it
    rerun = await claims.rerun(claim.row, max_runs=2)
    assert isinstance(rerun, Claimed) and rerun.row["status"] == Status.STARTING.value
