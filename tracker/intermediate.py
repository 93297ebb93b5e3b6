"""Intermediate webhooks (``start``, ``output``, ``logs``) for one prediction: a preempting sender.

At most one request in flight and at most one every ``interval`` seconds; a newer state replaces
one still waiting (every body is the whole prediction, so the newest says everything the older
did); failures are dropped, never retried. ``start`` is never replaced by a later state, so the
receiver always sees it first. Closing drops whatever is pending: ``completed`` supersedes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import Callable, Sequence

import aiohttp

from tracker.webhooks import DeliveryFailed, WebhookPolicy, post

log = logging.getLogger(__name__)


class IntermediateSender:
    def __init__(
        self,
        session: aiohttp.ClientSession,
        policy: WebhookPolicy,
        url: str,
        secret: str,
        events: Sequence[str] | None,
    ) -> None:
        self.session = session
        self.policy = policy
        self.url = url
        self.secret = secret
        self.events = set(events) if events is not None else {"start", "output", "logs"}
        self._start: Callable[[], str] | None = None
        self._latest: tuple[str, Callable[[], str]] | None = None
        self._ready = asyncio.Event()
        self._idle = asyncio.Event()
        self._sending = False
        self._task: asyncio.Task[None] | None = None
        self.sent: list[str] = []

    def offer(self, event: str, body: Callable[[], str]) -> None:
        """Queue ``event``; ``body`` renders the prediction when the request is made."""
        if event not in self.events:
            return
        if event == "start":
            self._start = body
        else:
            self._latest = (event, body)
        self._ready.set()
        if self._task is None:
            self._task = asyncio.create_task(self._pump())

    async def _pump(self) -> None:
        loop = asyncio.get_running_loop()
        next_allowed = 0.0
        while True:
            await self._ready.wait()
            self._ready.clear()
            delay = next_allowed - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            taken = self._take()
            if taken is None:
                continue
            event, render = taken
            next_allowed = loop.time() + self.policy.intermediate_interval
            self._sending = True
            self._idle.clear()
            try:
                await post(
                    self.session,
                    self.policy,
                    self.url,
                    "msg_" + secrets.token_hex(12),
                    self.secret,
                    render(),
                )
                self.sent.append(event)
            except DeliveryFailed as failure:
                log.debug("intermediate %s webhook dropped: %s", event, failure)
            except Exception:  # never let one bad send silence the rest of the prediction
                log.exception("intermediate %s webhook failed", event)
            finally:
                self._sending = False
                self._idle.set()
            if self._start is not None or self._latest is not None:
                self._ready.set()

    def _take(self) -> tuple[str, Callable[[], str]] | None:
        if self._start is not None:
            render, self._start = self._start, None
            return "start", render
        taken, self._latest = self._latest, None
        return taken

    async def close(self, grace: float = 2.0) -> None:
        """Drop what is pending; give a request already on the wire ``grace`` seconds to land,
        so it does not arrive after the ``completed`` webhook."""
        self._start = self._latest = None
        if self._task is None or self._task.done():
            return
        if self._sending:
            with contextlib.suppress(TimeoutError, Exception):
                await asyncio.wait_for(self._idle.wait(), grace)
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._task
