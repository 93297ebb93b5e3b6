"""Cancels reaching a director: the published ones, and a runner that ignores one.

A cancel is published on ``keys.CANCEL_CHANNEL`` fire-and-forget; :class:`CancelListener` sets
the cancel flag of the attempt this director runs for that prediction (one published while it
was not subscribed is read from Postgres by the execution). A runner that never confirms a
cancel is suspect (:class:`Suspicion`): the director takes no work until its health check says
READY again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from redis.asyncio import Redis

from core.transient import TRANSIENT
from director.attempts import Attempts
from director.runner_monitor import RunnerMonitor
from protocol.values import HealthStatus
from tracker import keys

log = logging.getLogger(__name__)


class CancelListener:
    def __init__(self, redis: Redis, attempts: Attempts, stopping: asyncio.Event) -> None:
        self.redis = redis
        self.attempts = attempts
        self.stopping = stopping

    async def run(self) -> None:
        """Listen until ``stopping`` is set, subscribing again whenever the subscription is
        lost: a cancel listener that stops is a director that ignores cancels."""
        while not self.stopping.is_set():
            try:
                async with self.redis.pubsub() as pubsub:
                    await pubsub.subscribe(keys.CANCEL_CHANNEL)
                    async for message in pubsub.listen():
                        if message["type"] != "message":
                            continue
                        data = message["data"]
                        pid = data.decode() if isinstance(data, bytes) else str(data)
                        target = self.attempts.for_prediction(pid)
                        if target is not None:
                            target.cancel.set()
            except TRANSIENT as error:
                log.debug("cancel subscription lost: %r", error)
                await self._pause(1.0)
            except Exception:
                log.exception("cancel subscription failed; subscribing again")
                await self._pause(1.0)

    async def _pause(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stopping.wait(), seconds)


class Suspicion:
    """The monitor of a runner that ignored a cancel, while it is not READY again."""

    def __init__(self) -> None:
        self.monitor: RunnerMonitor | None = None

    def ignored_cancel(self, monitor: RunnerMonitor) -> None:
        log.warning("runner ignored a cancel: taking no work until its health check is READY")
        self.monitor = monitor

    def clear_if_ready(self, suspect: RunnerMonitor | None) -> None:
        """Take work again once ``suspect`` (the one when the director began waiting) is
        READY."""
        if suspect is not None and suspect.status is HealthStatus.READY:
            log.info("runner is READY again; taking work")
            self.monitor = None
