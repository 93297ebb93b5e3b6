"""The gateway's request log, ``block_inference``: the seed's columns (``request_id``,
``session_id``, ``block_id``, ``seq_no``, ``ts``, ``frame_ptr``, ``data``, ``query_parameters``,
``output_ptr``; files are never logged) plus ``status``, ``error``, ``latency_ms``, the
account, where the call came from (``origin``: another cluster's gateway) and the request of
the graph it is a step of (``graph_parent``).

The table is partitioned by day on ``ts`` (migration 0017): :func:`maintain_partitions`
creates the coming days' partitions and retires those past the retention by detaching and
dropping them (never ``DELETE``). When the database has TimescaleDB the table is a hypertable
with its own retention policy and there is nothing to maintain. Rows are written in batches
with ``COPY`` (:func:`copy_entries`). Request ids are UUIDv7 (:func:`core.ids.new_request_id`):
a lookup by id is bounded in time by the id itself, so it reads one partition.

Every field is bounded (:func:`bounded_text`, :func:`bounded_payload`): ``session_id``,
``block_id`` and ``origin`` keep at most :data:`KEY_CHARS` characters and ``error``
:data:`ERROR_CHARS`, a cut value ending in :data:`CUT` (no NUL, which ``text`` cannot hold);
a payload (``data``, ``frame_ptr``, ``query_parameters``, ``output_ptr``) larger than its bound
is logged empty, since half a payload is no payload.

Reads (:func:`find`) filter by session, block, request, account and a time range, oldest
first, paged by a cursor on ``(ts, request_id)``.
"""

from __future__ import annotations

import base64
import re
import uuid
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any

import psycopg
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from core.ids import request_id_time
from tracker.db import autocommit

TABLE = "block_inference"
COLUMNS = (
    "request_id",
    "session_id",
    "block_id",
    "seq_no",
    "ts",
    "frame_ptr",
    "data",
    "query_parameters",
    "output_ptr",
    "status",
    "error",
    "latency_ms",
    "account_id",
    "origin",
    "graph_parent",
)
_PARTITION = re.compile(rf"{TABLE}_p(\d{{8}})")
#: Characters kept of a key column (``session_id``, ``block_id``, ``origin``): every session id
#: the gateway takes whole, and well under what a btree index entry may hold (2,704 bytes).
KEY_CHARS = 256
#: Characters kept of an ``error``.
ERROR_CHARS = 1024
#: What ends a cut text value.
CUT = "…"
#: How far a request's ``ts`` may be from the time its id was drawn.
ID_SLACK = timedelta(minutes=1)


@dataclass(frozen=True, slots=True)
class LogEntry:
    request_id: uuid.UUID
    session_id: str
    block_id: str
    seq_no: int
    ts: datetime
    frame_ptr: bytes
    data: bytes
    query_parameters: bytes
    output_ptr: bytes
    #: The call's gRPC status name (``OK``, ``NOT_FOUND``, …) and its message when not OK.
    status: str
    error: str | None
    latency_ms: float
    account_id: int | None
    origin: str | None = None
    graph_parent: uuid.UUID | None = None

    def row(self) -> tuple[Any, ...]:
        return tuple(getattr(self, name) for name in COLUMNS)


def bounded_text(value: str, limit: int) -> str:
    """``value`` with NUL replaced (``U+FFFD``) and cut to ``limit`` characters, the last of
    them :data:`CUT`."""
    value = value.replace("\x00", "\ufffd")
    if len(value) <= limit:
        return value
    return value[: limit - len(CUT)] + CUT


def bounded_payload(value: bytes, limit: int) -> bytes:
    """``value``, or nothing when it is larger than ``limit`` bytes."""
    return value if len(value) <= limit else b""


class NoPartition(Exception):
    """An entry's ``ts`` falls on a day no partition holds yet."""


async def copy_entries(engine: AsyncEngine, entries: list[LogEntry]) -> None:
    """Write ``entries`` with one ``COPY`` in one transaction (nothing written when it
    raises)."""
    async with engine.connect() as conn:
        raw = await conn.get_raw_connection()
        driver: Any = raw.driver_connection
        try:
            async with driver.cursor() as cursor:
                statement = f"COPY {TABLE} ({', '.join(COLUMNS)}) FROM STDIN"
                async with cursor.copy(statement) as copy:
                    for entry in entries:
                        await copy.write_row(entry.row())
        except psycopg.errors.CheckViolation as error:
            await driver.rollback()
            if "no partition" in str(error):
                raise NoPartition(str(error)) from None
            raise
        await driver.commit()


def partition_name(day: date) -> str:
    return f"{TABLE}_p{day:%Y%m%d}"


async def maintain_partitions(
    engine: AsyncEngine, today: date, ahead: int, retention_days: int
) -> tuple[list[str], list[str]]:
    """Create the partitions of ``today - 1`` to ``today + ahead`` that are missing; detach and
    drop those of days before ``today - retention_days``. The partitions created and dropped;
    nothing for a hypertable (TimescaleDB keeps its own)."""
    created: list[str] = []
    dropped: list[str] = []
    async with autocommit(engine).connect() as conn:
        kind = (
            await conn.execute(
                text("SELECT relkind FROM pg_class WHERE relname = :t AND relkind IN ('p', 'r')"),
                {"t": TABLE},
            )
        ).scalar_one_or_none()
        if kind != "p":
            return created, dropped
        existing = set(
            (
                await conn.execute(
                    text(
                        "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
                        " JOIN pg_class p ON p.oid = i.inhparent WHERE p.relname = :t"
                    ),
                    {"t": TABLE},
                )
            ).scalars()
        )
        for offset in range(-1, ahead + 1):
            day = today + timedelta(days=offset)
            name = partition_name(day)
            if name in existing:
                continue
            start = datetime(day.year, day.month, day.day, tzinfo=UTC)
            await conn.execute(
                text(
                    f"CREATE TABLE IF NOT EXISTS {name} PARTITION OF {TABLE}"
                    f" FOR VALUES FROM ('{start.isoformat()}')"
                    f" TO ('{(start + timedelta(days=1)).isoformat()}')"
                )
            )
            created.append(name)
        oldest = today - timedelta(days=retention_days)
        for name in sorted(existing):
            matched = _PARTITION.fullmatch(name)
            if matched is None or datetime.strptime(matched[1], "%Y%m%d").date() >= oldest:
                continue
            await conn.execute(text(f"ALTER TABLE {TABLE} DETACH PARTITION {name}"))
            await conn.execute(text(f"DROP TABLE {name}"))
            dropped.append(name)
    return created, dropped


def encode_cursor(ts: datetime, request_id: uuid.UUID) -> str:
    raw = f"{ts.isoformat()}|{request_id}".encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, uuid.UUID]:
    """The cursor's position; :class:`ValueError` for one this module did not make."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        ts, _, request_id = raw.partition("|")
        return datetime.fromisoformat(ts), uuid.UUID(request_id)
    except (ValueError, UnicodeDecodeError) as error:
        raise ValueError(f"not a cursor this api made: {error}") from None


async def find(
    engine: AsyncEngine,
    *,
    account_id: int | None,
    session_id: str | None = None,
    block_id: str | None = None,
    request_id: uuid.UUID | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    after: tuple[datetime, uuid.UUID] | None = None,
    limit: int = 100,
) -> list[dict[str, Any]]:
    """Log rows, oldest first: the account's (every account's when None), matching each filter
    given, at most ``limit``, after ``after`` (a cursor's position)."""
    clauses: list[str] = []
    params: dict[str, Any] = {"limit": limit}
    if account_id is not None:
        clauses.append("account_id = :account")
        params["account"] = account_id
    for column, value in (("session_id", session_id), ("block_id", block_id)):
        if value is not None:
            clauses.append(f"{column} = :{column}")
            params[column] = value
    if request_id is not None:
        clauses.append("request_id = :request")
        params["request"] = request_id
        drawn = request_id_time(request_id)
        if drawn is not None:  # prunes to the partition(s) of that moment
            at = datetime.fromtimestamp(drawn, UTC)
            since = max(since, at - ID_SLACK) if since else at - ID_SLACK
            until = min(until, at + ID_SLACK) if until else at + ID_SLACK
    if since is not None:
        clauses.append("ts >= :since")
        params["since"] = since
    if until is not None:
        clauses.append("ts < :until")
        params["until"] = until
    if after is not None:
        clauses.append("(ts, request_id) > (:after_ts, :after_id)")
        params["after_ts"], params["after_id"] = after
    where = " AND ".join(clauses) or "TRUE"
    statement = text(
        f"SELECT {', '.join(COLUMNS)} FROM {TABLE} WHERE {where}"
        " ORDER BY ts, request_id LIMIT :limit"
    )
    async with autocommit(engine).connect() as conn:
        rows = (await conn.execute(statement, params)).mappings().all()
    return [dict(row) for row in rows]
