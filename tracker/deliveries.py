"""Durable terminal (``completed``) webhooks: stored with the terminal state, retried until
delivered or given up, by whichever process runs a ``Dispatcher`` (directors and the api).

``enqueue_completed`` runs inside the transaction that writes the terminal state, so a committed
terminal state always has its webhook on record. Dispatchers lease due rows with
``FOR UPDATE SKIP LOCKED``: any number cooperate, a crashed one's lease simply expires, and a
dead or slow receiver only ever occupies a slot of the dispatcher's own bounded pool.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import Mapping
from typing import Any

import aiohttp
import orjson
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from tracker.render import render_prediction
from tracker.webhooks import DeliveryFailed, WebhookPolicy, post

log = logging.getLogger(__name__)

_LEASE_DUE = text(
    """
    UPDATE webhook_deliveries d
    SET next_attempt_at = now() + make_interval(secs => :lease)
    FROM accounts a
    WHERE a.id = d.account_id AND d.id IN (
        SELECT id FROM webhook_deliveries
        WHERE status = 'pending' AND next_attempt_at <= now()
        ORDER BY next_attempt_at
        LIMIT :limit
        FOR UPDATE SKIP LOCKED
    )
    RETURNING d.id, d.url, d.body, d.attempts, d.account_id, a.webhook_secret
    """
)
_DELIVERED = text(
    "UPDATE webhook_deliveries SET status = 'delivered', delivered_at = now(), "
    "attempts = attempts + 1, last_status = :status, last_error = NULL WHERE id = :id"
)
_RETRY = text(
    "UPDATE webhook_deliveries SET attempts = attempts + 1, last_status = :status, "
    "last_error = :error, next_attempt_at = now() + make_interval(secs => :delay) WHERE id = :id"
)
_GIVE_UP = text(
    "UPDATE webhook_deliveries SET status = 'failed', attempts = attempts + 1, "
    "last_status = :status, last_error = :error WHERE id = :id"
)
# 410 Gone: the receiver says this URL is dead; stop every pending retry to it.
_GONE = text(
    "UPDATE webhook_deliveries SET status = 'failed', last_status = 410, "
    "last_error = 'receiver answered 410 Gone' "
    "WHERE status = 'pending' AND account_id = :account_id AND url = :url"
)
_INSERT = text(
    "INSERT INTO webhook_deliveries (id, prediction_id, account_id, url, event, body) "
    "VALUES (:id, :prediction_id, :account_id, :url, 'completed', :body)"
)


def wants(row: Mapping[Any, Any], event: str) -> bool:
    if not row["webhook"]:
        return False
    wanted = row["webhook_events_filter"]
    return wanted is None or event in wanted


async def enqueue_completed(conn: AsyncConnection, row: Mapping[Any, Any], base_url: str) -> bool:
    """Record the ``completed`` webhook for a row that just became terminal (same transaction)."""
    if not wants(row, "completed"):
        return False
    body = orjson.dumps(render_prediction(row, base_url)).decode()
    await conn.execute(
        _INSERT,
        {
            "id": "msg_" + secrets.token_hex(12),
            "prediction_id": row["id"],
            "account_id": row["account_id"],
            "url": row["webhook"],
            "body": body,
        },
    )
    return True


class Dispatcher:
    """Delivers due terminal webhooks with a bounded pool; ``wake()`` after a commit."""

    def __init__(
        self, engine: AsyncEngine, policy: WebhookPolicy, session: aiohttp.ClientSession
    ) -> None:
        self.engine = engine
        self.policy = policy
        self.session = session
        self._slots = asyncio.Semaphore(policy.concurrency)
        self._wake = asyncio.Event()
        self._inflight: set[asyncio.Task[None]] = set()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    def wake(self) -> None:
        self._wake.set()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for task in list(self._inflight):
            task.cancel()
        if self._inflight:
            await asyncio.wait(self._inflight)

    async def _run(self) -> None:
        while True:
            try:
                await self._dispatch_due()
            except Exception as error:  # a database outage must not end the dispatcher
                log.warning("webhook dispatch pass failed: %r", error)
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.policy.poll_interval)

    async def _dispatch_due(self) -> None:
        free = self.policy.concurrency - len(self._inflight)
        if free <= 0:
            return
        async with self.engine.begin() as conn:
            rows = (
                await conn.execute(_LEASE_DUE, {"lease": self.policy.lease, "limit": free})
            ).all()
        for row in rows:
            task = asyncio.create_task(self._deliver(*row))
            self._inflight.add(task)
            task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._inflight.discard(task)
        self._wake.set()  # a slot is free: look for more due work

    async def _deliver(
        self, id: str, url: str, body: str, attempts: int, account_id: int, secret: str
    ) -> None:
        async with self._slots:
            try:
                status = await post(self.session, self.policy, url, id, secret, body)
            except DeliveryFailed as failure:
                await self._record_failure(id, url, account_id, attempts + 1, failure)
                return
        async with self.engine.begin() as conn:
            await conn.execute(_DELIVERED, {"id": id, "status": status})

    async def _record_failure(
        self, id: str, url: str, account_id: int, attempts: int, failure: DeliveryFailed
    ) -> None:
        params = {"id": id, "status": failure.status, "error": str(failure)[:1000]}
        delay = self.policy.retry_delay(attempts)
        async with self.engine.begin() as conn:
            if failure.status == 410:
                await conn.execute(_GIVE_UP, params)
                await conn.execute(_GONE, {"account_id": account_id, "url": url})
            elif delay is None:
                await conn.execute(_GIVE_UP, params)
            else:
                await conn.execute(_RETRY, {**params, "delay": delay})
        log.info("webhook %s attempt %d failed: %s", id, attempts, failure)
