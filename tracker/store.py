"""Prediction rows in Postgres: new predictions (one, or many in one statement) and their
``Idempotency-Key`` rows, the reads of one or of an account's list, and an account's cancel.

Every state write is a conditional UPDATE: it names the statuses it may leave (and a run's
writes, ``tracker.attempt_writes``, the attempt they belong to), so a stale or duplicate
write matches no row and changes nothing (fencing). Callers learn whether their write won from
the returned row.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

import orjson
from sqlalchemy import (
    Float,
    Table,
    and_,
    case,
    func,
    insert,
    literal,
    select,
    text,
    true,
    update,
)
from sqlalchemy.engine import RowMapping
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from protocol.timings import RunnerTimes
from tracker.batch_writes import RETURNED
from tracker.db import autocommit
from tracker.deliveries import enqueue_completed
from tracker.keyset import PageKey, keyset_page
from tracker.record_tables import IdempotencyKey, UsageRecord
from tracker.render import PredictionLinks
from tracker.states import UNFINISHED, Status, check_transition
from tracker.tables import Prediction

predictions = cast(Table, Prediction.__table__)
usage_records = cast(Table, UsageRecord.__table__)
idempotency_keys = cast(Table, IdempotencyKey.__table__)
# A queued prediction is canceled on the spot (below): the table must allow it.
check_transition(Status.STARTING, Status.CANCELED)


@dataclass(frozen=True, slots=True)
class NewPrediction:
    id: str
    account_id: int
    model: str
    version_id: str
    deployment_id: int | None
    deployment: str | None
    input: dict[str, Any]
    webhook: str | None
    webhook_events_filter: list[str] | None
    target: str
    deadline: datetime | None = None
    source: str = "api"
    priority: str | None = None
    #: ``input`` as canonical JSON (``tracker.input_checks``): stored as these bytes when given.
    input_json: bytes | None = None
    #: The create request's ``X-Request-Id``.
    request_id: str | None = None
    #: The gateway graph run it is a step of (``predictions.graph``).
    graph: dict[str, Any] | None = None
    #: ``prediction`` or ``training``; a training's destination model.
    kind: str = "prediction"
    destination: str | None = None


async def insert_prediction(conn: AsyncConnection, new: NewPrediction) -> RowMapping:
    """One new prediction, in the caller's transaction; stored as ``insert_predictions`` does."""
    result = await conn.execute(_INSERT_MANY, {"batch": _json_rows([_values(new)])})
    row: RowMapping = result.mappings().one()
    return row


_INSERT_MANY = text(
    """
    INSERT INTO predictions (id, account_id, model, version_id, deployment_id, deployment,
      input, webhook, webhook_events_filter, target, deadline, source, priority, request_id,
      graph, kind, destination)
    SELECT v.id, v.account_id, v.model, v.version_id, v.deployment_id, v.deployment, v.input,
      v.webhook, v.webhook_events_filter, v.target, v.deadline, v.source, v.priority,
      v.request_id, v.graph, v.kind, v.destination
    FROM jsonb_to_recordset(CAST(:batch AS jsonb)) AS v(id text, account_id bigint,
      model text, version_id text, deployment_id bigint, deployment text, input jsonb,
      webhook text, webhook_events_filter text[], target text, deadline timestamptz,
      source text, priority text, request_id text, graph jsonb, kind text, destination text)
    RETURNING """
    + RETURNED
).columns(*predictions.c)


async def insert_predictions(engine: AsyncEngine, news: list[NewPrediction]) -> list[RowMapping]:
    """Several new predictions in one statement (atomic); their rows, in the order given.

    The rows travel as one JSON parameter, so the statement's text is the same for any number
    of rows and the server prepares it once (a multi-row VALUES differs with each count)."""
    batch = _json_rows([_values(new) for new in news])
    async with autocommit(engine).connect() as conn:
        result = await conn.execute(_INSERT_MANY, {"batch": batch})
        by_id = {row["id"]: row for row in result.mappings().all()}
    return [by_id[new.id] for new in news]


def _json_rows(rows: list[dict[str, Any]]) -> str:
    """The batch parameter. An input orjson cannot encode (an integer beyond 64 bits, say)
    raises here, before anything is stored: what is stored must be sendable."""
    return orjson.dumps(rows).decode()


def _values(new: NewPrediction) -> dict[str, Any]:
    return {
        "id": new.id,
        "account_id": new.account_id,
        "model": new.model,
        "version_id": new.version_id,
        "deployment_id": new.deployment_id,
        "deployment": new.deployment,
        "input": orjson.Fragment(new.input_json) if new.input_json is not None else new.input,
        "webhook": new.webhook,
        "webhook_events_filter": new.webhook_events_filter,
        "target": new.target,
        "deadline": new.deadline,
        "source": new.source,
        "priority": new.priority,
        "request_id": new.request_id,
        "graph": new.graph,
        "kind": new.kind,
        "destination": new.destination,
    }


async def try_xact_lock(conn: AsyncConnection, lock_id: int) -> bool:
    """Take a transaction-scoped advisory lock without waiting; False when another holds it.

    Held until ``conn``'s transaction commits or rolls back.
    """
    acquired = await conn.scalar(select(func.pg_try_advisory_xact_lock(lock_id)))
    return bool(acquired)


async def idempotent_prediction(
    conn: AsyncConnection, account_id: int, key: str
) -> RowMapping | None:
    """The prediction an ``Idempotency-Key`` names, plus the key's ``request_sha256``."""
    k = idempotency_keys.c
    query = (
        select(predictions, k.request_sha256)
        .join(idempotency_keys, k.prediction_id == predictions.c.id)
        .where(k.account_id == account_id, k.key == key)
    )
    return (await conn.execute(query)).mappings().one_or_none()


async def insert_idempotency_key(
    conn: AsyncConnection, account_id: int, key: str, request_sha256: str, prediction_id: str
) -> None:
    values = {
        "account_id": account_id,
        "key": key,
        "request_sha256": request_sha256,
        "prediction_id": prediction_id,
    }
    await conn.execute(insert(idempotency_keys).values(values))


async def get_for_account(
    engine: AsyncEngine, account_id: int, id: str, kind: str | None = "prediction"
) -> RowMapping | None:
    """The account's prediction (or training, by ``kind``; None: either): another's, or one
    of the other kind, is None."""
    c = predictions.c
    query = select(predictions).where(c.id == id, c.account_id == account_id)
    if kind is not None:
        query = query.where(c.kind == kind)
    async with autocommit(engine).connect() as conn:
        return (await conn.execute(query)).mappings().one_or_none()


async def get(engine: AsyncEngine, id: str) -> RowMapping | None:
    async with autocommit(engine).connect() as conn:
        query = select(predictions).where(predictions.c.id == id)
        return (await conn.execute(query)).mappings().one_or_none()


async def list_for_account(
    engine: AsyncEngine,
    account_id: int,
    *,
    after: PageKey | None,
    before: PageKey | None,
    limit: int,
    created_after: datetime | None = None,
    created_before: datetime | None = None,
    source: str | None = None,
    kind: str = "prediction",
) -> list[RowMapping]:
    """Newest first. ``after`` pages towards older rows, ``before`` towards newer ones; only
    rows of ``kind`` created strictly between ``created_after`` and ``created_before``, from
    ``source``."""
    c = predictions.c
    query = select(predictions).where(c.account_id == account_id, c.kind == kind)
    if created_after is not None:
        query = query.where(c.created_at > created_after)
    if created_before is not None:
        query = query.where(c.created_at < created_before)
    if source is not None:
        query = query.where(c.source == source)
    query = keyset_page(query, c.created_at, c.id, after=after, before=before)
    async with autocommit(engine).connect() as conn:
        rows = list((await conn.execute(query.limit(limit))).mappings().all())
    if before is not None:
        rows.reverse()
    return rows


async def request_cancel(
    engine: AsyncEngine,
    account_id: int,
    id: str,
    webhook_links: PredictionLinks | None = None,
    kind: str | None = None,
) -> tuple[RowMapping | None, bool]:
    """Flag a cancel; a prediction still queued and unclaimed is canceled on the spot.

    A claimed one keeps its status: the director that owns it sees the flag (or the published
    cancel) and stops the runner. The claim sets ``claim_owner`` under the same row lock, so the
    two paths cannot both win. Returns the row and whether this call made it terminal.
    ``kind``: only a prediction or only a training (None: either, as the operator page acts).
    """
    c = predictions.c
    same_kind = c.kind == kind if kind is not None else true()
    queued = and_(c.status == Status.STARTING.value, c.claim_owner.is_(None))
    now = func.now()
    statement = (
        update(predictions)
        .where(c.id == id, c.account_id == account_id, c.status.in_(UNFINISHED), same_kind)
        .values(
            cancel_requested=True,
            status=case((queued, Status.CANCELED.value), else_=c.status),
            completed_at=case((queued, now), else_=c.completed_at),
            metrics=case((queued, _metrics_sql(None)), else_=c.metrics),
        )
        .returning(predictions)
    )
    async with engine.begin() as conn:
        row: RowMapping | None = (await conn.execute(statement)).mappings().one_or_none()
        canceled_now = row is not None and row["status"] == Status.CANCELED.value
        if canceled_now and webhook_links is not None:
            assert row is not None
            await enqueue_completed(conn, row, webhook_links)
    if row is not None:
        return row, canceled_now
    return await get_for_account(engine, account_id, id, kind), False


def _metrics_sql(times: RunnerTimes | None) -> Any:
    """Replicate's ``metrics``: ``total_time`` (since creation) and what the runner reported."""
    total = func.extract("epoch", func.now() - predictions.c.created_at)
    reported = times.public_metrics() if times is not None else {}
    pairs: list[Any] = []
    for name, value in reported.items():
        pairs += [name, literal(value, Float)]
    return func.jsonb_build_object(*pairs, "total_time", total)


async def cancel_requested(engine: AsyncEngine, id: str) -> bool:
    async with autocommit(engine).connect() as conn:
        query = select(predictions.c.cancel_requested).where(predictions.c.id == id)
        return bool((await conn.execute(query)).scalar())
