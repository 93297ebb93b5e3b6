"""Webhook delivery from the runner to whoever started a prediction.

Unlike coglet, which fires each non-terminal webhook as its own task (so they can arrive out
of order), every prediction gets one :class:`WebhookSender` whose single task posts its
snapshots in order. Snapshots are cumulative, so a newer one simply replaces a pending one
that has not gone out yet. Non-terminal posts are best effort; the terminal one is retried
with exponential backoff. None of it ever holds a prediction slot: a slow or dead receiver
must not wedge the model (cog issues #742, #2229).

A webhook URL comes from whoever started the prediction, so the sender trusts nothing about it
(DESIGN §8): the SSRF guard (:mod:`core.ssrf`) refuses at once a URL that names an internal
address outside ``CONDUIT_RUNNER_WEBHOOK_ALLOW`` or a route of Cog's runner protocol on any
host (``/shutdown``, ``/predictions/<id>/cancel`` ...; 422, before anything runs) and checks every
address a name resolves to before connecting; redirects are not followed (a 3xx is a refusal);
at most :data:`MAX_ANSWER_BYTES` of an answer is read, undecoded; connecting is bounded by its
own short timeout. The headers are fixed here: never the runner token, only coglet's
``WEBHOOK_AUTH_TOKEN`` (the credential meant for webhook receivers, which the settings keep
apart from the runner token) and the request's trace context.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Collection, Mapping
from typing import Any, Protocol

import aiohttp
import orjson
import yarl

from core.backoff import backoff_delay
from core.ssrf import BlockedAddress, GuardedResolver, check_webhook_url
from core.unreachable import UNREACHABLE
from protocol.headers import ACCEPT, AUTHORIZATION, CONTENT_TYPE, JSON, USER_AGENT
from protocol.values import WebhookEvent
from runners import COG_VERSION
from runners.config import RunnerConfig
from runners.request_errors import WebhookRefusedError

log = logging.getLogger(__name__)

_RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
MAX_ANSWER_BYTES = 64 * 1024
"""Most bytes of a receiver's answer read; the status is all the sender needs."""
DRAIN_GRACE = 1.0
"""Seconds an answer's body gets to end once its status is known; past it the connection is
dropped and the status still stands, so a receiver that drips its body is not sent the
webhook again."""


class SnapshotSink(Protocol):
    """Where a prediction's snapshots go: a webhook sender, or the response that started it."""

    def send(self, event: WebhookEvent, snapshot: dict[str, Any]) -> None: ...

    def close(self) -> None:
        """Nothing more will be sent here (another caller took the prediction over)."""


class WebhookDispatcher:
    """Owns the runner's one HTTP client session and every sender task, for draining."""

    def __init__(self, config: RunnerConfig) -> None:
        self.config = config
        self._session: aiohttp.ClientSession | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self._session = open_session(self.config)

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("WebhookDispatcher.start() has not run")
        return self._session

    def sender(
        self, url: str, events: Collection[WebhookEvent], trace: Mapping[str, str]
    ) -> WebhookSender | None:
        """A sender for one prediction, or None (logged) when ``url`` is not http(s), as
        coglet ignores such a webhook. Raises :class:`WebhookRefusedError` when the SSRF guard
        refuses it."""
        parsed = yarl.URL(url)
        if parsed.scheme not in ("http", "https") or not parsed.host:
            log.error("ignoring webhook %r: not an http(s) URL", url)
            return None
        config = self.config
        try:
            check_webhook_url(url, config.webhook_networks(), config.webhook_hosts())
        except BlockedAddress as error:
            raise WebhookRefusedError(
                f"{error} (allowed: CONDUIT_RUNNER_WEBHOOK_ALLOW={config.webhook_allow})"
            ) from error
        headers = {
            CONTENT_TYPE: JSON,
            ACCEPT: "*/*",
            USER_AGENT: f"coglet/{COG_VERSION}",
            **trace,
        }
        if self.config.webhook_auth_token:
            headers[AUTHORIZATION] = f"Bearer {self.config.webhook_auth_token}"
        return WebhookSender(self, url, frozenset(events), headers)

    def spawn(self, sender: WebhookSender) -> asyncio.Task[None]:
        task = asyncio.create_task(sender.deliver())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def close(self, timeout: float) -> None:
        """Give pending deliveries ``timeout`` seconds, then drop them and close the session."""
        if self._tasks:
            _, pending = await asyncio.wait(set(self._tasks), timeout=timeout)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending)
        if self._session is not None:
            await self._session.close()


def open_session(config: RunnerConfig) -> aiohttp.ClientSession:
    """The runner's one webhook session: guarded resolver, short connect timeout, answers
    left compressed (never inflated: only their status is read)."""
    connector = aiohttp.TCPConnector(
        resolver=GuardedResolver(config.webhook_networks(), allow_hosts=config.webhook_hosts())
    )
    timeout = aiohttp.ClientTimeout(
        total=config.webhook_timeout, sock_connect=config.webhook_connect_timeout
    )
    return aiohttp.ClientSession(connector=connector, timeout=timeout, auto_decompress=False)


async def post(
    session: aiohttp.ClientSession, url: str, body: bytes, headers: Mapping[str, str]
) -> int:
    """One POST; its status. Follows no redirect, reads at most :data:`MAX_ANSWER_BYTES` of
    the answer, for at most :data:`DRAIN_GRACE` seconds, and drops the connection when there
    is more: the status line is the answer, whatever its body does. Raises what
    ``UNREACHABLE`` lists, or :class:`BlockedAddress` when the URL's name resolves only to
    refused addresses.
    """
    async with session.post(url, data=body, headers=headers, allow_redirects=False) as response:
        try:
            async with asyncio.timeout(DRAIN_GRACE):
                await read_capped(response.content, MAX_ANSWER_BYTES)
        except (TimeoutError, aiohttp.ClientError):
            response.close()
        if not response.content.at_eof():
            response.close()  # unread rest: not worth a connection's reuse
        return response.status


async def read_capped(content: aiohttp.StreamReader, limit: int) -> bytes:
    """At most ``limit`` bytes of ``content``, fewer when it ends first."""
    data = bytearray()
    while len(data) < limit:
        chunk = await content.read(limit - len(data))
        if not chunk:
            break
        data += chunk
    return bytes(data)


class WebhookSender:
    """One prediction's webhooks, posted in order by a single task."""

    def __init__(
        self,
        dispatcher: WebhookDispatcher,
        url: str,
        events: frozenset[WebhookEvent],
        headers: dict[str, str],
    ) -> None:
        self._dispatcher = dispatcher
        self._config = dispatcher.config
        self.url = url
        #: How logs name the receiver: its origin only, as a director's URL ends in a secret.
        self.where = f"{yarl.URL(url).origin()}/..."
        self.events = events
        self._headers = headers
        self._pending: dict[str, Any] | None = None
        self._terminal: dict[str, Any] | None = None
        self._finished = False
        self._last_queued = float("-inf")
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def send(self, event: WebhookEvent, snapshot: dict[str, Any]) -> None:
        """Queue ``snapshot`` for ``event``; never blocks. ``completed`` ends the sender."""
        if self._finished:
            return
        if event is WebhookEvent.COMPLETED:
            self._finished = True
            if event in self.events:
                self._terminal, self._pending = snapshot, None
        elif event not in self.events or self._throttled(event):
            return
        else:
            self._pending = snapshot
        self._wake.set()
        if self._task is None:
            self._task = self._dispatcher.spawn(self)

    def close(self) -> None:
        """Send nothing more, not even what is still pending (its receiver is gone)."""
        self._finished = True
        self._pending = self._terminal = None
        self._wake.set()

    def _throttled(self, event: WebhookEvent) -> bool:
        # Only logs are throttled: coglet learned that throttling output made the director
        # miss intermediate outputs. Any non-terminal post restarts the logs interval.
        now = time.monotonic()
        if event is WebhookEvent.LOGS and now - self._last_queued < self._config.throttle_interval:
            return True
        self._last_queued = now
        return False

    async def deliver(self) -> None:
        try:
            await self._deliver()
        except Exception:
            log.exception("webhook delivery to %s stopped", self.where)

    async def _deliver(self) -> None:
        while True:
            if self._pending is not None:
                payload, self._pending = self._pending, None
                await self._post_best_effort(payload)
            elif self._terminal is not None:
                await self._post_with_retries(self._terminal)
                return
            elif self._finished:
                return
            else:
                self._wake.clear()
                await self._wake.wait()

    async def _post(self, payload: dict[str, Any]) -> int:
        body = orjson.dumps(payload, option=orjson.OPT_SORT_KEYS)
        return await post(self._dispatcher.session, self.url, body, self._headers)

    async def _post_best_effort(self, payload: dict[str, Any]) -> None:
        try:
            await self._post(payload)
        except UNREACHABLE as error:
            log.debug("non-terminal webhook to %s failed: %r", self.where, error)
        except BlockedAddress as error:
            log.error("webhook to %s not sent: %s", self.where, error)

    async def _post_with_retries(self, payload: dict[str, Any]) -> None:
        for attempt in range(self._config.webhook_max_retries + 1):
            try:
                status = await self._post(payload)
            except UNREACHABLE as error:
                log.warning("terminal webhook to %s failed: %r", self.where, error)
            except BlockedAddress as error:
                log.error("terminal webhook to %s not sent: %s", self.where, error)
                return
            else:
                if status < 300:
                    return
                if status not in _RETRY_STATUSES:
                    log.error("terminal webhook to %s refused with %d", self.where, status)
                    return
                log.warning("terminal webhook to %s answered %d", self.where, status)
            if attempt < self._config.webhook_max_retries:
                base = self._config.webhook_backoff_base
                await asyncio.sleep(backoff_delay(attempt + 1, initial=base, cap=base * 1024))
        attempts = self._config.webhook_max_retries + 1
        log.error("terminal webhook to %s gave up after %d attempts", self.where, attempts)
