"""``Prefer: wait[=N]``: hold a create request until the prediction is done or N seconds pass.

The wait follows the prediction's event stream through the process's one reader
(``tracker.event_hub``: no Redis connection per waiter, no Postgres polling) and races the client's
disconnect: a client that goes away ends the wait, never the prediction. A process holding its
most waiters (or the account's or the prediction's share of them, ``tracker.waiter_shares``), or
shutting down, answers at once instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import functools
from collections.abc import Hashable
from dataclasses import dataclass

from starlette.requests import Request

from api.errors import InvalidRequest
from lane.departure import Departure
from tracker.event_hub import EventHub, Subscription
from tracker.events import EventType

MAX_WAIT = 60


def parse_wait(header: str | None) -> tuple[int, str] | None:
    """The wait in seconds and the ``Preference-Applied`` value, or None without ``wait``."""
    if not header:
        return None
    for preference in header.split(","):
        name, _, value = preference.strip().partition("=")
        if name.strip().lower() != "wait":
            continue
        if not value:
            return MAX_WAIT, "wait"
        value = value.strip().strip('"')
        if not (value.isascii() and value.isdigit()) or not 1 <= int(value) <= MAX_WAIT:
            raise InvalidRequest(
                f"Prefer: wait must be between 1 and {MAX_WAIT} seconds, got {value!r}",
                errors=[{"field": "Prefer", "message": f"wait must be 1..{MAX_WAIT}"}],
            )
        return int(value), f"wait={int(value)}"
    return None


class WaitEnd(enum.Enum):
    DONE = "done"  # the prediction finished
    TIMED_OUT = "timed out"  # the wait ran out first
    CLIENT_LEFT = "client left"  # the client disconnected first
    RELEASED = "released"  # the process began shutting down
    #: The process already holds its most waiters, or the account's or the prediction's
    #: share of them: no wait at all.
    DECLINED = "declined"


@dataclass(frozen=True, slots=True)
class Waited:
    """How a ``Prefer: wait`` ended; ``prediction`` is the final JSON when the ``done`` event
    carried it."""

    end: WaitEnd
    prediction: str | None = None


async def wait_for_done(subscription: Subscription, seconds: float) -> Waited:
    """Events from the process's hub (``tracker.event_hub``) until ``done`` or ``seconds`` pass."""
    try:
        async with asyncio.timeout(seconds):
            async for event in subscription:
                if event.type is EventType.DONE:
                    return Waited(WaitEnd.DONE, event.prediction)
    except TimeoutError:
        return Waited(WaitEnd.TIMED_OUT)
    return Waited(WaitEnd.RELEASED)


async def disconnected(request: Request) -> None:
    """Return when the client of ``request`` has gone (read its receive channel up to
    ``http.disconnect``); what a :class:`lane.departure.Departure` watches for the api."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def wait_or_disconnect(
    request: Request,
    hub: EventHub,
    prediction_id: str,
    seconds: float,
    account: Hashable | None = None,
) -> Waited:
    """Wait for ``prediction_id`` (of ``account``, whose share of the waiters it takes)."""
    subscription = hub.subscribe(prediction_id, account=account)
    if subscription is None:
        return Waited(WaitEnd.RELEASED if hub.released else WaitEnd.DECLINED)
    waiter = asyncio.ensure_future(wait_for_done(subscription, seconds))
    departure = Departure(functools.partial(disconnected, request))
    try:
        answered = await departure.first(waiter)
    finally:
        subscription.close()
        await departure.close()
        if not waiter.done():
            waiter.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await waiter
    return waiter.result() if answered else Waited(WaitEnd.CLIENT_LEFT)
