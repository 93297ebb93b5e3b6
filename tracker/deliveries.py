"""Durable terminal (``completed``) webhooks: stored with the terminal state, retried until
delivered or given up, by whichever process runs a ``Dispatcher`` (directors and the api).

``enqueue_completed`` runs inside the transaction that writes the terminal state, so a committed
terminal state always has its webhook on record. Dispatchers lease due rows with
``FOR UPDATE SKIP LOCKED``: any number cooperate, a crashed one's lease simply expires, and a
dead or slow receiver only ever occupies a slot of the dispatcher's own bounded pool.

One account's deliveries hold at most ``policy.per_account`` of those slots: a dispatcher never
leases a row it could not send at once, so an account at its cap leaves its due rows in the
table, holding no slot and no lease, for a later pass (or another dispatcher) once one of its
requests ends. Nothing is dropped, and rows are still taken oldest first within each account.

The database away or its pool starved (``core.transient.TRANSIENT``) is an outage to wait out: a
pass that cannot lease is retried at the next, and an attempt's outcome is recorded through it
(``persistently``) for up to half a lease. Past that the attempt is left to its lease, which
expires and sends the webhook again (receivers deduplicate on ``webhook-id``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import secrets
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import aiohttp
import orjson
from redis.asyncio import Redis
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from core.transient import TRANSIENT, persistently
from tracker.db import autocommit
from tracker.fleet import FleetView
from tracker.render import PredictionLinks, render_prediction
from tracker.webhook_targets import FleetTargets
from tracker.webhooks import DeliveryFailed, WebhookPolicy, post

log = logging.getLogger(__name__)

#: The shortest pause between passes (seconds): no busy loop on a row another holds.
MIN_PAUSE = 0.05

# Due rows, oldest first, at most ``room`` per account (its cap less what this dispatcher has
# in flight for it) and ``free`` in all. Accounts already at their cap are left out of the scan,
# so a backlog of theirs cannot hide other accounts' rows; ``seen`` counts the rows scanned,
# telling the caller whether some were left for being over their account's room.
_LEASE_DUE = text(
    """
    WITH candidates AS (
        SELECT id, account_id, next_attempt_at FROM webhook_deliveries
        WHERE status = 'pending' AND next_attempt_at <= now()
            AND account_id <> ALL(CAST(:full AS bigint[]))
        ORDER BY next_attempt_at
        LIMIT :scan
        FOR UPDATE SKIP LOCKED
    ), ranked AS (
        SELECT c.id, c.next_attempt_at,
            row_number() OVER (PARTITION BY c.account_id ORDER BY c.next_attempt_at, c.id) AS rank,
            :per_account - coalesce(b.busy, 0) AS room
        FROM candidates c
        LEFT JOIN unnest(CAST(:busy_accounts AS bigint[]), CAST(:busy_counts AS int[]))
            AS b(account_id, busy) ON b.account_id = c.account_id
    ), picked AS (
        SELECT id FROM ranked WHERE rank <= room ORDER BY next_attempt_at, id LIMIT :free
    )
    UPDATE webhook_deliveries d
    SET next_attempt_at = now() + make_interval(secs => :lease)
    FROM picked p, accounts a
    WHERE d.id = p.id AND a.id = d.account_id
    RETURNING d.id, d.url, d.body, d.attempts, d.account_id, a.webhook_secret,
        (SELECT count(*) FROM candidates) AS seen
    """
)
# Seconds until the earliest pending delivery is due (a retry's backoff, or a lease a dispatcher
# holds, expiring): None when nothing is pending. Read from the partial index of pending rows.
_NEXT_DUE = text(
    "SELECT extract(epoch FROM min(next_attempt_at) - now())::float8 "
    "FROM webhook_deliveries WHERE status = 'pending'"
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


async def enqueue_completed(
    conn: AsyncConnection, row: Mapping[Any, Any], links: PredictionLinks
) -> bool:
    """Record the ``completed`` webhook for a row that just became terminal (same transaction)."""
    if not wants(row, "completed"):
        return False
    body = orjson.dumps(render_prediction(row, links)).decode()
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
        self,
        engine: AsyncEngine,
        policy: WebhookPolicy,
        session: aiohttp.ClientSession,
        redis: Redis | None = None,
        fleet: FleetView | None = None,
    ) -> None:
        """With ``redis``, ``policy.refused`` follows the fleet registry while the dispatcher
        runs (:mod:`tracker.webhook_targets`): no webhook of this process reaches a runner.
        With ``fleet``, a view the process already keeps, it follows that instead of reading
        the registry a second time."""
        self.engine = engine
        self.policy = policy
        self.session = session
        source = fleet if fleet is not None else redis
        self.targets = None if source is None else FleetTargets(source, policy.refused)
        self._wake = asyncio.Event()
        self._inflight: set[asyncio.Task[None]] = set()
        #: Deliveries in flight per account; an account is absent when it has none.
        self._busy: Counter[int] = Counter()
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
        if self.targets is not None:
            await self.targets.stop()
        for task in list(self._inflight):
            task.cancel()
        if self._inflight:
            await asyncio.wait(self._inflight)

    async def _run(self) -> None:
        if self.targets is not None:
            await self.targets.start()  # the fleet first: nothing is sent before it is known
        while True:
            # Cleared before the pass: a wake during it (a new row) is a reason for another.
            self._wake.clear()
            pause = self.policy.poll_interval
            try:
                pause = min(pause, await self._dispatch_due())
            except Exception as error:  # a database outage must not end the dispatcher
                log.warning("webhook dispatch pass failed: %r", error)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), pause)

    async def _dispatch_due(self) -> float:
        """Lease and send what is due; the seconds until the next pending row falls due (a
        retry's backoff or another dispatcher's lease running out), so that the next pass
        comes then rather than at the next poll. A new row is due at once and its writer
        wakes its own dispatcher: the poll is only for a writer that died before sending."""
        # A pass that left rows over their account's room may have hidden other accounts' rows
        # behind them; those accounts are now at their cap, so the next pass skips them.
        while (free := self.policy.concurrency - len(self._inflight)) > 0:
            rows, seen = await self._lease(free)
            for row in rows:
                self._send(*row)
            if len(rows) == free or seen == len(rows):
                break
        if self._inflight:
            return self.policy.poll_interval  # each delivery that ends wakes the loop
        async with autocommit(self.engine).connect() as conn:
            due_in = (await conn.execute(_NEXT_DUE)).scalar_one()
        # A row due already is one another dispatcher is leasing right now: look again soon.
        return self.policy.poll_interval if due_in is None else max(due_in, MIN_PAUSE)

    async def _lease(self, free: int) -> tuple[list[tuple[Any, ...]], int]:
        per_account = self.policy.per_account
        params = {
            "lease": self.policy.lease,
            "free": free,
            "scan": 4 * free,
            "per_account": per_account,
            "full": [account for account, busy in self._busy.items() if busy >= per_account],
            "busy_accounts": list(self._busy),
            "busy_counts": list(self._busy.values()),
        }
        # One statement: atomic on its own, its row locks held to its end.
        async with autocommit(self.engine).connect() as conn:
            rows = (await conn.execute(_LEASE_DUE, params)).all()
        return [tuple(row)[:-1] for row in rows], (rows[0].seen if rows else 0)

    def _send(
        self, id: str, url: str, body: str, attempts: int, account_id: int, secret: str
    ) -> None:
        self._busy[account_id] += 1
        task = asyncio.create_task(self._deliver(id, url, body, attempts, account_id, secret))
        self._inflight.add(task)
        task.add_done_callback(lambda task: self._finished(task, account_id))

    def _finished(self, task: asyncio.Task[None], account_id: int) -> None:
        self._inflight.discard(task)
        self._busy[account_id] -= 1
        if not self._busy[account_id]:
            del self._busy[account_id]
        self._wake.set()  # a slot is free: look for more due work

    async def _deliver(
        self, id: str, url: str, body: str, attempts: int, account_id: int, secret: str
    ) -> None:
        try:
            status = await post(self.session, self.policy, url, id, secret, body)
        except DeliveryFailed as failure:
            record = functools.partial(
                self._record_failure, id, url, account_id, attempts + 1, failure
            )
        else:
            record = functools.partial(self._record_delivered, id, status)
        await self._recorded(id, record)

    async def _recorded(self, id: str, record: Callable[[], Awaitable[None]]) -> None:
        """Run ``record`` through a short database outage (see the module's docstring)."""
        try:
            await persistently(f"recording webhook {id}", record, self.policy.lease / 2)
        except TRANSIENT as error:
            log.warning(
                "webhook %s: outcome not recorded, sent again after its lease: %r", id, error
            )

    async def _record_delivered(self, id: str, status: int) -> None:
        async with autocommit(self.engine).connect() as conn:
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
