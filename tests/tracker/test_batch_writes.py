"""Grouped starts and ends against the real Postgres: every caller keeps its own fence."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import event, text
from sqlalchemy.ext.asyncio import AsyncEngine

from protocol.timings import RunnerTimes
from tests.fixtures.predictions import new_predictions
from tracker import attempt_writes, store
from tracker.batch_writes import StateWrites, _unique_rounds
from tracker.db import autocommit
from tracker.group_commit import Batcher
from tracker.states import Status
from tracker.usage import CPU


async def _claimed(engine: AsyncEngine, count: int) -> list[str]:
    news = await new_predictions(engine, [{"i": i} for i in range(count)], "batch")
    rows = await store.insert_predictions(engine, news)
    assert [row["id"] for row in rows] == [new.id for new in news]  # the order given
    assert [row["input"] for row in rows] == [{"i": i} for i in range(count)]
    for new in news:
        assert await attempt_writes.claim(engine, new.id, "director-a") is not None
    return [new.id for new in news]


async def test_concurrent_ends_each_get_their_own_row(engine: AsyncEngine) -> None:
    ids = await _claimed(engine, 40)
    writes = StateWrites(engine)  # one per process: concurrent calls share its statements
    started = await asyncio.gather(*(attempt_writes.mark_processing(writes, pid, 1) for pid in ids))
    assert all(row is not None and row["started_at"] is not None for row in started)
    # Half of them are written by a stale attempt: those must all lose, the rest all win.
    finished = await asyncio.gather(
        *(
            attempt_writes.finish(
                writes,
                pid,
                1 if i % 2 == 0 else 7,
                Status.SUCCEEDED,
                output=[f"out-{i}"],
                logs=f"log {i}\n",
                times=RunnerTimes(predict_time=0.25, queue_wait_time=0.01),
                hardware=CPU,
            )
            for i, pid in enumerate(ids)
        )
    )
    for i, (pid, row) in enumerate(zip(ids, finished, strict=True)):
        if i % 2:
            assert row is None
            continue
        assert row is not None and row["id"] == pid
        assert row["status"] == "succeeded" and row["output"] == [f"out-{i}"]
        assert row["logs"] == f"log {i}\n"
        assert row["metrics"]["predict_time"] == 0.25 and row["metrics"]["total_time"] >= 0
    async with engine.connect() as conn:
        usage = dict(
            (
                await conn.execute(
                    text(
                        "SELECT prediction_id, billable_seconds FROM usage_records "
                        "WHERE prediction_id = ANY(:ids)"
                    ),
                    {"ids": ids},
                )
            ).all()
        )
    assert usage == {pid: 0.25 for i, pid in enumerate(ids) if i % 2 == 0}


async def test_concurrent_starts_through_one_state_writes_share_statements(
    engine: AsyncEngine,
) -> None:
    """Grouping lives in the ``StateWrites`` a process builds once and passes down: starts
    that arrive together through it are written by far fewer statements than starts."""
    ids = await _claimed(engine, 30)
    statements: list[str] = []

    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if "jsonb_to_recordset" in statement and "processing" in statement:
            statements.append(statement)

    event.listen(engine.sync_engine, "before_cursor_execute", record)
    try:
        writes = StateWrites(engine)
        started = await asyncio.gather(
            *(attempt_writes.mark_processing(writes, pid, 1) for pid in ids)
        )
    finally:
        event.remove(engine.sync_engine, "before_cursor_execute", record)
    assert all(row is not None for row in started)
    assert 1 <= len(statements) < len(ids) / 2


async def test_a_second_end_for_the_same_prediction_is_fenced(engine: AsyncEngine) -> None:
    (pid,) = await _claimed(engine, 1)
    writes = StateWrites(engine)
    first, second = await asyncio.gather(
        attempt_writes.finish(writes, pid, 1, Status.FAILED, error="first"),
        attempt_writes.finish(writes, pid, 1, Status.CANCELED),
    )
    assert (first is None) != (second is None)  # exactly one terminal state
    row = await store.get(engine, pid)
    assert row is not None and row["status"] in ("failed", "canceled")


async def test_output_left_alone_unless_given(engine: AsyncEngine) -> None:
    (pid,) = await _claimed(engine, 1)
    assert await attempt_writes.mark_processing(engine, pid, 1) is not None
    assert await attempt_writes.save_progress(engine, pid, 1, ["kept"], "so far\n")
    row = await attempt_writes.finish(engine, pid, 1, Status.CANCELED)
    assert row is not None and row["output"] == ["kept"] and row["logs"] == "so far\n"
    assert row["started_at"] is not None and row["completed_at"] is not None


async def test_an_end_written_without_its_start_records_the_run(engine: AsyncEngine) -> None:
    """A fast run's start and end arrive together and are written as one: the row still says
    when it started (predict_time before the end) and that it ran once; a run that never
    started (canceled while queued in the runner) gets neither."""
    ran, failed_running, never_ran = await _claimed(engine, 3)
    async with engine.begin() as conn:  # created long enough ago to have run that long
        await conn.execute(
            text("UPDATE predictions SET created_at = now() - interval '5 s' WHERE id = ANY(:ids)"),
            {"ids": [ran, failed_running, never_ran]},
        )
    writes = StateWrites(engine)
    ends = await asyncio.gather(
        attempt_writes.finish(
            writes, ran, 1, Status.SUCCEEDED, times=RunnerTimes(predict_time=0.2)
        ),
        attempt_writes.finish(
            writes, failed_running, 1, Status.FAILED, times=RunnerTimes(predict_time=0.1)
        ),
        attempt_writes.finish(
            writes, never_ran, 1, Status.CANCELED, times=RunnerTimes(predict_time=0.0)
        ),
    )
    for row, predict_time in zip(ends[:2], (0.2, 0.1), strict=True):
        assert row is not None and row["runs"] == 1
        ran_for = (row["completed_at"] - row["started_at"]).total_seconds()
        assert abs(ran_for - predict_time) < 1e-3, ran_for
        assert row["started_at"] >= row["created_at"]
    canceled = ends[2]
    assert canceled is not None and canceled["started_at"] is None and canceled["runs"] == 0
    # A start already written is kept, and not counted twice.
    (pid,) = await _claimed(engine, 1)
    started = await attempt_writes.mark_processing(engine, pid, 1)
    assert started is not None
    row = await attempt_writes.finish(
        engine, pid, 1, Status.SUCCEEDED, times=RunnerTimes(predict_time=9)
    )
    assert row is not None and row["started_at"] == started["started_at"] and row["runs"] == 1
    # A runner's figure never puts the start before the creation.
    (pid,) = await _claimed(engine, 1)
    row = await attempt_writes.finish(
        engine, pid, 1, Status.SUCCEEDED, times=RunnerTimes(predict_time=60)
    )
    assert row is not None and row["started_at"] == row["created_at"]


def test_rounds_never_name_a_prediction_twice() -> None:
    assert _unique_rounds(["a", "b", "a", "c", "a"]) == [[0, 1, 3], [2], [4]]
    assert _unique_rounds([]) == []


async def test_batcher_groups_while_a_write_is_in_flight() -> None:
    batches: list[list[int]] = []
    writing, release = asyncio.Event(), asyncio.Event()

    async def write(items: list[int]) -> list[int]:
        batches.append(items)
        writing.set()
        if len(batches) == 1:
            await release.wait()
        return [item * 10 for item in items]

    batcher: Batcher[int, int] = Batcher(write)
    first = asyncio.ensure_future(batcher.submit(1))
    await writing.wait()
    rest = [asyncio.ensure_future(batcher.submit(n)) for n in (2, 3, 4)]
    release.set()
    assert await first == 10 and await asyncio.gather(*rest) == [20, 30, 40]
    assert batches == [[1], [2, 3, 4]]


async def test_batcher_gives_each_caller_the_error() -> None:
    async def write(items: list[int]) -> list[int]:
        raise RuntimeError("down")

    batcher: Batcher[int, int] = Batcher(write)
    results = await asyncio.gather(batcher.submit(1), batcher.submit(2), return_exceptions=True)
    assert all(isinstance(result, RuntimeError) for result in results)


async def test_a_bad_item_fails_only_its_own_caller() -> None:
    writes: list[list[int]] = []

    async def write(items: list[int]) -> list[int]:
        writes.append(items)
        if 13 in items:
            raise ValueError("unlucky")
        return [item * 10 for item in items]

    batcher: Batcher[int, int] = Batcher(write)
    results = await asyncio.gather(*(batcher.submit(n) for n in (1, 13, 2)), return_exceptions=True)
    assert results[0] == 10 and results[2] == 20 and isinstance(results[1], ValueError)
    assert writes == [[1, 13, 2], [1], [13], [2]]  # the failed batch, then each on its own


async def test_inserted_rows_keep_every_field(engine: AsyncEngine) -> None:
    """Rows go in as one JSON document: 64-bit integers, floats jsonb prints as integers,
    arrays and timestamps come back as given, in the order given."""
    deadline = datetime.now(UTC) + timedelta(minutes=5)
    first_input = {"seed": 2**64 - 1, "low": -(2**63), "float": 1e20, "text": "é\\n"}
    news = await new_predictions(engine, [first_input, {"n": 1.5}], "insert")
    news[0] = replace(
        news[0],
        webhook="https://example.com/hook",
        webhook_events_filter=["start", "completed"],
        deadline=deadline,
        priority="high",
    )
    rows = await store.insert_predictions(engine, news)
    assert [row["id"] for row in rows] == [new.id for new in news]
    first, second = rows
    assert first["input"] == first_input
    assert isinstance(first["input"]["float"], float)
    assert first["webhook_events_filter"] == ["start", "completed"]
    assert first["deadline"] == deadline and first["priority"] == "high"
    assert first["status"] == "starting" and first["attempt"] == 0
    assert second["input"] == {"n": 1.5} and second["deadline"] is None
    assert second["webhook"] is None and second["webhook_events_filter"] is None


async def test_an_input_that_cannot_be_sent_is_not_stored(engine: AsyncEngine) -> None:
    """An integer beyond 64 bits could be stored but never sent on: refused before the insert."""
    (new,) = await new_predictions(engine, [{"seed": 2**70}], "unsendable")
    with pytest.raises(TypeError):
        await store.insert_predictions(engine, [new])
    assert await store.get(engine, new.id) is None


async def test_grouped_writes_find_their_rows_by_primary_key_whatever_the_backlog(
    engine: AsyncEngine,
) -> None:
    """A claim, a start or an end must cost the same with 10 or 100,000 predictions waiting:
    each statement looks its rows up in the primary key, never by scanning the unfinished
    ones or the table (what the planner does when it only has the join to the batch)."""
    news = await new_predictions(engine, [{"i": i} for i in range(3000)], "backlog")
    for start in range(0, len(news), 500):
        await store.insert_predictions(engine, news[start : start + 500])
    async with autocommit(engine).connect() as conn:
        await conn.execute(text("ANALYZE predictions"))
    executed: list[tuple[str, Any]] = []

    def record(conn: Any, cursor: Any, statement: str, parameters: Any, *args: Any) -> None:
        if "jsonb_to_recordset" in statement and statement.lstrip().startswith(("UPDATE", "WITH")):
            executed.append((statement, parameters))

    pid = news[0].id
    writes = StateWrites(engine)
    event.listen(engine.sync_engine, "before_cursor_execute", record)
    try:
        assert await attempt_writes.claim(writes, pid, "director-a") is not None
        assert await attempt_writes.mark_processing(writes, pid, 1) is not None
        assert await attempt_writes.finish(writes, pid, 1, Status.SUCCEEDED) is not None
    finally:
        event.remove(engine.sync_engine, "before_cursor_execute", record)
    assert len(executed) == 3
    async with autocommit(engine).connect() as conn:
        for statement, parameters in executed:
            plan = "\n".join(
                row[0] for row in await conn.exec_driver_sql("EXPLAIN " + statement, parameters)
            )
            assert "Index Scan using pk_predictions on predictions" in plan, plan
            assert "Seq Scan on predictions" not in plan, plan
            assert "ix_predictions_unfinished" not in plan, plan
