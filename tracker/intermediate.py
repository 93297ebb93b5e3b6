"""Intermediate webhooks (``start``, ``output``, ``logs``) for one prediction: a preempting sender.

At most one request in flight and at most one every ``interval`` seconds; a newer state replaces
one still waiting (every body is the whole prediction, so the newest says everything the older
did); failures are dropped, never retried. ``start`` is never replaced by a later state, so the
receiver always sees it first.

Closing never waits: a slow receiver must not hold up the prediction's ``done`` event, its
``completed`` webhook or the director's next prediction. Whatever is pending is dropped
(``completed`` supersedes it); a request already on the wire finishes in the background, bounded
by the webhook timeout, so it may land after ``completed`` (every body carries ``status``; a
receiver keeps the terminal one).

All senders on one HTTP session share one ``SendSlots``: ``policy.concurrency`` request slots.
The session's connection pool holds twice that, and the durable ``completed`` dispatcher uses at
most the other half, so slow receivers of intermediate events can never starve ``completed``
deliveries. Within those slots one account's senders hold at most ``policy.per_account`` at
once, taking the account's slot before a shared one: an account whose receivers are slow waits
for its own requests to end while other accounts' go ahead. A state waiting for either slot is
still pending (a newer one replaces it, ``close`` drops it), so the order above is kept.
The process that opens the session builds its ``SendSlots`` beside it.

Before each send the sender asks its attempt's fence whether the attempt still owns the
prediction: a director paused past its lease wakes with sends queued (or a throttle timer due)
and must not deliver them once another director has taken over.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass

import aiohttp

from tracker.fence import Fence
from tracker.webhooks import DeliveryFailed, WebhookPolicy, post

log = logging.getLogger(__name__)


class AccountSlots:
    """At most ``per_account`` holders at once per account, waiting in arrival order.

    A waiter holds nothing else: callers take their account's slot before any shared slot, so
    an account at its cap waits without keeping another account's request from starting.
    """

    def __init__(self, per_account: int) -> None:
        self.per_account = per_account
        self._accounts: dict[int, _Account] = {}

    @asynccontextmanager
    async def hold(self, account_id: int) -> AsyncIterator[None]:
        account = self._accounts.get(account_id)
        if account is None:
            account = self._accounts[account_id] = _Account(asyncio.Semaphore(self.per_account))
        account.users += 1
        try:
            async with account.slots:
                yield
        finally:
            account.users -= 1
            if account.users == 0:  # nobody holds or waits: forget the account
                del self._accounts[account_id]


@dataclass
class _Account:
    slots: asyncio.Semaphore
    #: Holders and waiters.
    users: int = 0


class SendSlots:
    """What every sender on one HTTP session shares: its request slots (all, and each
    account's), and the closed senders whose last request is still on the wire (held so they
    are not collected)."""

    def __init__(self, session: aiohttp.ClientSession, policy: WebhookPolicy) -> None:
        self.session = session
        self.policy = policy
        self.semaphore = asyncio.Semaphore(policy.concurrency)
        self.accounts = AccountSlots(policy.per_account)
        self.lingering: set[asyncio.Task[None]] = set()

    def linger(self, task: asyncio.Task[None]) -> None:
        self.lingering.add(task)
        task.add_done_callback(self.lingering.discard)


class IntermediateSender:
    def __init__(
        self,
        slots: SendSlots,
        url: str,
        secret: str,
        events: Sequence[str] | None,
        fence: Fence,
        *,
        account_id: int,
    ) -> None:
        self.slots = slots
        self.account_id = account_id
        self.session = slots.session
        self.policy = slots.policy
        self.url = url
        self.secret = secret
        self.events = set(events) if events is not None else {"start", "output", "logs"}
        self._start: Callable[[], str] | None = None
        self._latest: tuple[str, Callable[[], str]] | None = None
        self._ready = asyncio.Event()
        self._sending = False
        self._closed = False
        self._task: asyncio.Task[None] | None = None
        self.fence = fence

    def offer(self, event: str, body: Callable[[], str]) -> None:
        """Queue ``event``; ``body`` renders the prediction when the request is made."""
        if event not in self.events or self._closed:
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
        while not self._closed:
            await self._ready.wait()
            self._ready.clear()
            delay = next_allowed - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            if not await self.fence.held():
                self._closed = True
                self._start = self._latest = None
                return
            async with self.slots.accounts.hold(self.account_id), self.slots.semaphore:
                taken = self._take()
                if taken is None:
                    continue
                next_allowed = loop.time() + self.policy.intermediate_interval
                self._sending = True
                try:
                    await self._send(*taken)
                finally:
                    self._sending = False
            if self._start is not None or self._latest is not None:
                self._ready.set()

    async def _send(self, event: str, render: Callable[[], str]) -> None:
        try:
            await post(
                self.session,
                self.policy,
                self.url,
                "msg_" + secrets.token_hex(12),
                self.secret,
                render(),
            )
        except DeliveryFailed as failure:
            log.debug("intermediate %s webhook dropped: %s", event, failure)
        except Exception:  # never let one bad send silence the rest of the prediction
            log.exception("intermediate %s webhook failed", event)

    def _take(self) -> tuple[str, Callable[[], str]] | None:
        if self._start is not None:
            render, self._start = self._start, None
            return "start", render
        taken, self._latest = self._latest, None
        return taken

    def close(self) -> None:
        """Drop what is pending and return at once; a request on the wire ends by itself."""
        self._closed = True
        self._start = self._latest = None
        task = self._task
        if task is None or task.done():
            return
        if not self._sending:
            task.cancel()
            return
        # The pump ends after this send (it checks ``_closed``); the timer only backs up the
        # session's own timeout.
        self.slots.linger(task)
        timer = asyncio.get_running_loop().call_later(self.policy.timeout, task.cancel)
        task.add_done_callback(lambda _: timer.cancel())
