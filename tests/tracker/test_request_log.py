"""The request log's table (``blocks.request_log``) on the session's migrated Postgres: entries
written with ``COPY`` and read back by each filter, oldest first, paged by cursor; partitions
made for the coming days and retired (detached and dropped) past the retention; a lookup by a
UUIDv7 request id reads one partition."""

from __future__ import annotations

import uuid
from datetime import UTC, date, datetime, timedelta

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from blocks.request_log import (
    LogEntry,
    NoPartition,
    copy_entries,
    decode_cursor,
    encode_cursor,
    find,
    maintain_partitions,
    partition_name,
)
from core.ids import new_request_id, request_id_time


def entry(session: str, block: str, seq_no: int, account: int, **fields: object) -> LogEntry:
    now = datetime.now(UTC)
    values: dict[str, object] = {
        "request_id": new_request_id(int(now.timestamp() * 1000)),
        "session_id": session,
        "block_id": block,
        "seq_no": seq_no,
        "ts": now,
        "frame_ptr": b"",
        "data": b'{"prompt": "x"}',
        "query_parameters": b"",
        "output_ptr": b"",
        "status": "OK",
        "error": None,
        "latency_ms": 1.5,
        "account_id": account,
        **fields,
    }
    return LogEntry(**values)  # type: ignore[arg-type]


async def test_written_and_found_by_each_filter(engine: AsyncEngine) -> None:
    await maintain_partitions(engine, datetime.now(UTC).date(), 1, 7)
    session, other = f"s-{uuid.uuid4().hex[:8]}", f"s-{uuid.uuid4().hex[:8]}"
    entries = [
        entry(session, "blk-aaaa", 1, 7001),
        entry(session, "blk-bbbb", 2, 7001, status="NOT_FOUND", error="no block"),
        entry(session, "blk-aaaa", 3, 7001),
        entry(other, "blk-aaaa", 1, 7002),
    ]
    await copy_entries(engine, entries)
    mine = await find(engine, account_id=7001, session_id=session)
    assert [row["seq_no"] for row in mine] == [1, 2, 3]
    assert mine[1]["status"] == "NOT_FOUND" and mine[1]["error"] == "no block"
    assert bytes(mine[0]["data"]) == b'{"prompt": "x"}'
    both = await find(engine, account_id=7001, session_id=session, block_id="blk-aaaa")
    assert [row["seq_no"] for row in both] == [1, 3]
    assert await find(engine, account_id=7002, session_id=session) == []  # not its own
    everyone = await find(engine, account_id=None, block_id="blk-aaaa", since=entries[0].ts)
    assert {row["session_id"] for row in everyone} >= {session, other}
    one = await find(engine, account_id=7001, request_id=entries[2].request_id)
    assert [row["seq_no"] for row in one] == [3]
    page = await find(engine, account_id=7001, session_id=session, limit=2)
    cursor = encode_cursor(page[-1]["ts"], page[-1]["request_id"])
    rest = await find(engine, account_id=7001, session_id=session, after=decode_cursor(cursor))
    assert [row["seq_no"] for row in page + rest] == [1, 2, 3]


async def test_partitions_made_ahead_and_retired_past_retention(engine: AsyncEngine) -> None:
    today = date(2031, 3, 10)  # days no other test writes
    created, _ = await maintain_partitions(engine, today, 2, 7)
    assert created == [partition_name(today + timedelta(days=d)) for d in (-1, 0, 1, 2)]
    assert await maintain_partitions(engine, today, 2, 7) == ([], [])
    later = today + timedelta(days=9)
    created, dropped = await maintain_partitions(engine, later, 0, 7)
    assert dropped == [partition_name(today + timedelta(days=d)) for d in (-1, 0, 1)]
    assert created == [partition_name(later + timedelta(days=d)) for d in (-1, 0)]
    async with engine.connect() as conn:
        left = (
            await conn.execute(
                text("SELECT count(*) FROM pg_class WHERE relname = :n"),
                {"n": partition_name(today)},
            )
        ).scalar_one()
    assert left == 0  # dropped, not only detached
    await maintain_partitions(engine, later + timedelta(days=30), 0, 1)  # leave none behind


async def test_a_day_without_a_partition_is_refused_whole(engine: AsyncEngine) -> None:
    far = datetime(2040, 1, 1, tzinfo=UTC)
    with pytest.raises(NoPartition):
        await copy_entries(engine, [entry("s", "blk-aaaa", 1, 7003, ts=far)])
    assert await find(engine, account_id=7003) == []


async def test_a_lookup_by_request_id_reads_one_partition(engine: AsyncEngine) -> None:
    today = datetime.now(UTC).date()
    await maintain_partitions(engine, today, 2, 7)
    request_id = new_request_id()
    drawn = request_id_time(request_id)
    assert drawn is not None and abs(drawn - datetime.now(UTC).timestamp()) < 5
    at = datetime.fromtimestamp(drawn, UTC)
    async with engine.connect() as conn:
        plan = (
            (
                await conn.execute(
                    text(
                        "EXPLAIN SELECT * FROM block_inference WHERE request_id = :r"
                        " AND ts >= :a AND ts < :b"
                    ),
                    {
                        "r": request_id,
                        "a": at - timedelta(minutes=1),
                        "b": at + timedelta(minutes=1),
                    },
                )
            )
            .scalars()
            .all()
        )
    scanned = {line.split(" on ")[1].split()[0] for line in plan if " on block_inference_p" in line}
    assert 1 <= len(scanned) <= 2  # the minute around the id's time: one day, two at midnight
