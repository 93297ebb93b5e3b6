"""Webhook delivery to clients: policy, Standard Webhooks signing, one guarded HTTP POST.

Signing follows Standard Webhooks (as Replicate does): ``webhook-id`` (the same on every retry
of one event), ``webhook-timestamp`` (unix seconds of this attempt) and ``webhook-signature``
(``v1,<base64 HMAC-SHA256 of "id.timestamp.body">`` keyed by the account's ``whsec_`` secret).
Redirects are never followed: a 3xx is a failed attempt.

A receiver is not trusted to be quick or brief: connecting has its own short timeout, the whole
attempt is bounded by ``timeout``, and at most ``RESPONSE_LIMIT`` bytes of the answer are read
(only its status matters) before the connection is dropped. The status line is the delivery: an
answer whose body drips, breaks off or never ends still counts by its status, and its body gets
``DRAIN_GRACE`` seconds to end (for the connection's reuse) before the connection is dropped.

Nor is a URL trusted (DESIGN §8): every attempt checks it again (:func:`check_webhook_url`), a
route of Cog's runner protocol or an endpoint of ``policy.refused`` (the fleet's runners, kept
current by :mod:`tracker.webhook_targets`) is refused whatever the address, and the resolver
hands out only addresses the guard permits.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

import aiohttp
from standardwebhooks.webhooks import Webhook

from core.backoff import backoff_delay
from core.ssrf import BlockedAddress, GuardedResolver, Network, RefusedEndpoints, check_webhook_url
from core.unreachable import UNREACHABLE

#: Seconds to wait before each retry of a terminal webhook: 11 attempts over 27.7 to 33.3 hours
#: (jitter only ever adds), so a receiver that is down for a whole day still gets it.
DEFAULT_SCHEDULE: tuple[float, ...] = (5, 30, 120, 600, 1800, 3600, 7200, 14400, 28800, 43200)
USER_AGENT = "conduit-webhooks/0.1"
#: Bytes of a receiver's answer read at most; the rest is never received.
RESPONSE_LIMIT = 64 * 1024
#: Seconds an answer's body gets to end once its status is known; past it the connection is
#: dropped, and the attempt still counts by its status.
DRAIN_GRACE = 1.0


@dataclass(frozen=True)
class WebhookPolicy:
    allow: Sequence[Network] = ()
    schedule: Sequence[float] = DEFAULT_SCHEDULE
    jitter: float = 0.2
    #: Seconds for a whole attempt: connecting, sending, the answer's status and its body.
    timeout: float = 10.0
    #: Seconds to establish the TCP connection, within ``timeout``.
    connect_timeout: float = 2.0
    #: Requests in flight on each half of the pool (durable and intermediate, see
    #: ``open_session``).
    concurrency: int = 16
    #: Requests in flight on each half for one account: its slow receivers leave the rest of
    #: the half to other accounts.
    per_account: int = 8
    intermediate_interval: float = 0.5
    poll_interval: float = 1.0
    #: Seconds a dispatcher holds a due delivery; a crashed holder's lease expires after this.
    lease: float = 30.0
    public_url: str = "http://127.0.0.1:8000"
    extra_headers: dict[str, str] = field(default_factory=dict)
    #: Endpoints no webhook may reach whatever ``allow`` opens: the fleet's runners, installed
    #: by whoever watches the fleet (:class:`tracker.webhook_targets.FleetTargets`).
    refused: RefusedEndpoints = field(default_factory=RefusedEndpoints, compare=False)

    def retry_delay(self, attempts: int) -> float | None:
        """Delay before the next attempt after ``attempts`` failures; None when out of tries.

        Jitter spreads retries of many deliveries apart but only ever lengthens a wait: the
        schedule's sum is the least time a delivery is retried for.
        """
        if attempts > len(self.schedule):
            return None
        return backoff_delay(attempts - 1, schedule=self.schedule, jitter=(1.0, 1.0 + self.jitter))


class DeliveryFailed(Exception):
    """One attempt failed; ``status`` is the HTTP status when there was a response."""

    def __init__(self, reason: str, status: int | None = None) -> None:
        super().__init__(reason)
        self.status = status


def sign(secret: str, message_id: str, body: str, when: datetime | None = None) -> dict[str, str]:
    # The library signs ``when.replace(tzinfo=UTC)``: convert first, or a non-UTC ``when`` signs
    # a different second than the header carries.
    when = (when or datetime.now(UTC)).astimezone(UTC)
    return {
        "webhook-id": message_id,
        "webhook-timestamp": str(int(when.timestamp())),
        "webhook-signature": Webhook(secret).sign(message_id, when, body),
    }


def open_session(policy: WebhookPolicy) -> aiohttp.ClientSession:
    # Two halves of ``concurrency`` connections: the durable dispatcher's slots and the
    # intermediate senders' shared slots (``tracker.intermediate``), so neither starves the other.
    connector = aiohttp.TCPConnector(
        resolver=GuardedResolver(policy.allow, refused=policy.refused),
        limit=policy.concurrency * 2,
    )
    return aiohttp.ClientSession(
        connector=connector,
        timeout=aiohttp.ClientTimeout(total=policy.timeout, sock_connect=policy.connect_timeout),
        headers={"User-Agent": USER_AGENT},
    )


async def post(
    session: aiohttp.ClientSession,
    policy: WebhookPolicy,
    url: str,
    message_id: str,
    secret: str,
    body: str,
) -> int:
    """One signed attempt. Returns the 2xx status; raises DeliveryFailed otherwise."""
    try:
        check_webhook_url(url, policy.allow, refused=policy.refused)
    except BlockedAddress as error:
        raise DeliveryFailed(str(error)) from error
    headers = {"Content-Type": "application/json", **sign(secret, message_id, body)}
    try:
        async with session.post(
            url, data=body.encode(), headers=headers, allow_redirects=False
        ) as response:
            await _drain(response)
            if 200 <= response.status < 300:
                return response.status
            raise DeliveryFailed(f"receiver answered {response.status}", response.status)
    except BlockedAddress as error:
        raise DeliveryFailed(str(error)) from error
    except UNREACHABLE as error:
        reason = str(error)
        if not reason and isinstance(error, TimeoutError):  # the attempt's own ``timeout``
            reason = f"not done within {policy.timeout:g} s"
        raise DeliveryFailed(f"{type(error).__name__}: {reason}") from error


async def _drain(response: aiohttp.ClientResponse) -> None:
    """Read what :func:`_read_some` reads, for at most ``DRAIN_GRACE`` seconds; an answer
    whose body is slower, breaks off or runs out of the attempt's time loses its connection,
    never its status."""
    try:
        async with asyncio.timeout(DRAIN_GRACE):
            await _read_some(response)
    except (TimeoutError, aiohttp.ClientError):
        response.close()


async def _read_some(response: aiohttp.ClientResponse) -> None:
    """Read at most ``RESPONSE_LIMIT`` bytes of the answer; drop the connection if there is more.

    Reading a short answer to its end lets the connection be reused; a longer one is cut off
    (the status is all that counts) so a receiver can never stream into the sender.
    """
    remaining = RESPONSE_LIMIT
    while remaining > 0:
        chunk = await response.content.read(remaining)
        if not chunk:
            return
        remaining -= len(chunk)
    if not response.content.at_eof():
        response.close()
