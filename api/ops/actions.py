"""What an operator does from ``/ops``: retry, cancel, on one prediction or on every one a
filter matches; discard dead letters; retry or give up a webhook. Every action leaves a row in
``ops_actions`` (who, what, on what, how many).

A retry is a new prediction made by Postgres from the old row in one statement (``INSERT …
SELECT``): the input is the stored JSON itself, byte for byte, never a re-encoding; the new row
names the old one (``retry_of``), and the old one's page lists its retries. Committed first,
then queued, as every create (``front.durable``): a Redis failure leaves it to the reconciler.

A bulk action runs in batches of ``BATCH`` from its ``ops_actions`` row: each batch's retries
(or cancels) and the row's progress (``done``, keyset ``cursor``) commit together, so one cut
short by a restart resumes where it stopped (``resume``) and acts on no prediction twice. It
works through the predictions that matched when it started (created before it), newest first.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime
from typing import Any

import orjson
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from api import serving
from api.deps import Resources
from api.ops import reads
from api.ops.filters import PredictionFilter
from api.ops.reads import PageKey
from core.ids import new_prediction_id
from tracker.keys import is_dead_letter_stream
from tracker.render import PredictionLinks
from tracker.states import TERMINAL, UNFINISHED

log = logging.getLogger(__name__)

BATCH = 500
_FINISHED = sorted(status.value for status in TERMINAL)

_RETRY = text(
    """
    INSERT INTO predictions (id, account_id, model, version_id, deployment_id, deployment,
      input, webhook, webhook_events_filter, target, source, priority, retry_of, kind,
      destination)
    SELECT m.new_id, p.account_id, p.model, p.version_id, p.deployment_id, p.deployment,
      p.input, p.webhook, p.webhook_events_filter, p.target, 'ops', p.priority, p.id, p.kind,
      p.destination
    FROM predictions p
    JOIN unnest(CAST(:old AS text[]), CAST(:new AS text[])) AS m(old_id, new_id)
      ON m.old_id = p.id
    WHERE p.id = ANY(CAST(:old AS text[])) AND p.status = ANY(CAST(:finished AS text[]))
    RETURNING id, account_id, target, retry_of
    """
)


class Refused(Exception):
    """The action cannot be taken as asked (shown to the operator as is)."""


async def audit(
    conn: AsyncConnection,
    account_id: int,
    action: str,
    subject: str | None = None,
    *,
    where: PredictionFilter | None = None,
    expected: int = 0,
    done: int = 0,
    status: str = "done",
    detail: str | None = None,
) -> int:
    found = await conn.scalar(
        text(
            "INSERT INTO ops_actions (account_id, action, subject, filter, expected, done, "
            "status, detail, finished_at) VALUES (:account, :action, :subject, "
            "CAST(:filter AS jsonb), :expected, :done, :status, :detail, "
            "CASE WHEN CAST(:finished AS boolean) THEN now() END) RETURNING id"
        ),
        {
            "account": account_id,
            "action": action,
            "subject": subject,
            "filter": orjson.dumps(where.as_dict()).decode() if where is not None else None,
            "expected": expected,
            "done": done,
            "status": status,
            "detail": detail,
            "finished": status != "running",
        },
    )
    return int(found)


async def _enqueue(resources: Resources, made: list[Any]) -> None:
    targets = await reads.targets(resources.engine, {row.target for row in made if row.target})
    for row in made:
        target = targets.get(row.target)
        if target is None:  # its deployment was deleted meanwhile: the reconciler says so
            log.warning("retry %s: no queue target %s", row.id, row.target)
            continue
        await resources.front.durable.enqueue(row, target)


async def _retry_rows(conn: AsyncConnection, ids: list[str]) -> list[Any]:
    news = [new_prediction_id() for _ in ids]
    result = await conn.execute(_RETRY, {"old": ids, "new": news, "finished": _FINISHED})
    return list(result)


async def retry_one(resources: Resources, operator: int, prediction_id: str) -> str:
    """The new prediction's id. Refused for an unfinished or unknown prediction."""
    async with resources.engine.begin() as conn:
        made = await _retry_rows(conn, [prediction_id])
        if not made:
            raise Refused(
                f"Prediction {prediction_id} is not finished (or does not exist): cancel it first."
            )
        await audit(conn, operator, "retry", prediction_id, detail=f"as {made[0].id}")
    await _enqueue(resources, made)
    return str(made[0].id)


async def cancel_one(
    resources: Resources, operator: int, prediction_id: str, links: PredictionLinks
) -> None:
    row = await reads.prediction(resources.engine, prediction_id)
    if row is None:
        raise Refused(f"Prediction {prediction_id} does not exist.")
    await serving.cancel_for(resources, row["account_id"], prediction_id, links)
    async with resources.engine.begin() as conn:
        await audit(conn, operator, "cancel", prediction_id)


async def start_bulk(
    resources: Resources, operator: int, action: str, where: PredictionFilter, expected: int
) -> int:
    """Record a bulk ``retry_all`` or ``cancel_all`` (``expected``: the count the operator
    confirmed); the caller runs it (``run_bulk``)."""
    if action not in ("retry_all", "cancel_all"):
        raise Refused(f"Unknown bulk action {action!r}.")
    async with resources.engine.begin() as conn:
        return await audit(conn, operator, action, where=where, expected=expected, status="running")


async def run_bulk(resources: Resources, action_id: int, links: PredictionLinks) -> None:
    """Work through a bulk action's batches from where its row says it stopped. Each batch
    holds the action's row lock: two replicas resuming the same action take turns, and one
    finding it held leaves it to the holder."""
    try:
        while await _next_batch(resources, action_id, links):
            await asyncio.sleep(0)  # the page's own requests get in between batches
    except Exception as error:
        log.exception("bulk action %s stopped", action_id)
        await _finish(resources.engine, action_id, "failed", repr(error)[:500])


async def _next_batch(resources: Resources, action_id: int, links: PredictionLinks) -> bool:
    """One batch; False once there is none left (or the action is not this process's)."""
    made: list[Any] = []
    async with resources.engine.begin() as conn:
        row = (
            (
                await conn.execute(
                    text(
                        "SELECT * FROM ops_actions WHERE id = :id AND status = 'running' "
                        "FOR UPDATE SKIP LOCKED"
                    ),
                    {"id": action_id},
                )
            )
            .mappings()
            .first()
        )
        if row is None:
            return False
        where, _ = PredictionFilter.parse(row["filter"] or {})
        cursor = row["cursor"]
        after = (
            PageKey(datetime.fromisoformat(cursor["created_at"]), cursor["id"]) if cursor else None
        )
        batch = await reads.matching_page(conn, where, row["created_at"], after, BATCH)
        if not batch:
            await conn.execute(
                text("UPDATE ops_actions SET status = 'done', finished_at = now() WHERE id = :id"),
                {"id": action_id},
            )
            return False
        after = PageKey(batch[-1]["created_at"], batch[-1]["id"])
        if row["action"] == "retry_all":
            made = await _retry_rows(conn, [r["id"] for r in batch])
            acted = len(made)
        else:
            acted = 0
            for found in batch:
                if found["status"] in UNFINISHED:
                    await serving.cancel_for(resources, found["account_id"], found["id"], links)
                    acted += 1
        await _progress(conn, action_id, acted, after)
    await _enqueue(resources, made)
    return True


async def _progress(conn: AsyncConnection, action_id: int, acted: int, after: PageKey) -> None:
    cursor = {"created_at": after.created_at.isoformat(), "id": after.id}
    await conn.execute(
        text(
            "UPDATE ops_actions SET done = done + :n, cursor = CAST(:cursor AS jsonb) "
            "WHERE id = :id"
        ),
        {"n": acted, "cursor": orjson.dumps(cursor).decode(), "id": action_id},
    )


async def _finish(engine: AsyncEngine, action_id: int, status: str, detail: str | None) -> None:
    async with engine.begin() as conn:
        await conn.execute(
            text(
                "UPDATE ops_actions SET status = :status, detail = coalesce(:detail, detail), "
                "finished_at = now() WHERE id = :id"
            ),
            {"status": status, "detail": detail, "id": action_id},
        )


async def unfinished_bulk(engine: AsyncEngine) -> list[int]:
    """Bulk actions cut short (by a restart): resumed at startup."""
    async with engine.connect() as conn:
        result = await conn.execute(text("SELECT id FROM ops_actions WHERE status = 'running'"))
        return [int(r[0]) for r in result]


async def discard_dead(resources: Resources, operator: int, stream: str, entry_id: str) -> None:
    if not is_dead_letter_stream(stream):
        raise Refused(f"{stream!r} is not a dead-letter stream.")
    await resources.redis.xdel(stream, entry_id)
    async with resources.engine.begin() as conn:
        await audit(conn, operator, "discard_dead", f"{stream} {entry_id}")


async def webhook_action(resources: Resources, operator: int, delivery_id: str, act: str) -> None:
    """``retry``: due now (pending again if it had failed); ``give_up``: failed, not retried."""
    statement = {
        "retry": "UPDATE webhook_deliveries SET status = 'pending', next_attempt_at = now() "
        "WHERE id = :id AND status <> 'delivered'",
        "give_up": "UPDATE webhook_deliveries SET status = 'failed', "
        "last_error = 'given up from /ops' WHERE id = :id AND status = 'pending'",
    }.get(act)
    if statement is None:
        raise Refused(f"Unknown webhook action {act!r}.")
    async with resources.engine.begin() as conn:
        changed = (await conn.execute(text(statement), {"id": delivery_id})).rowcount
        if not changed:
            raise Refused(f"Webhook delivery {delivery_id} is not in a state to {act}.")
        await audit(conn, operator, f"webhook_{act}", delivery_id)
    resources.dispatcher.wake()
