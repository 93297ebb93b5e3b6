"""``Prefer: wait[=N]``: hold a create request until the prediction is done or N seconds pass.

The wait reads the prediction's event stream (no Postgres polling) and races the client's
disconnect: a client that goes away ends the wait, never the prediction.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
from dataclasses import dataclass

from starlette.requests import Request

from api.errors import InvalidRequest
from tracker.events import EventLog, EventType

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


@dataclass(frozen=True, slots=True)
class Waited:
    """How a ``Prefer: wait`` ended; ``prediction`` is the final JSON when the ``done`` event
    carried it."""

    end: WaitEnd
    prediction: str | None = None


async def wait_for_done(events: EventLog, prediction_id: str, seconds: float) -> Waited | None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    after = "0"
    while True:
        remaining_ms = int((deadline - loop.time()) * 1000)
        if remaining_ms <= 0:  # BLOCK 0 would mean "forever"
            return None
        for event in await events.read(prediction_id, after, block_ms=remaining_ms):
            after = event.id
            if event.type is EventType.DONE:
                return Waited(WaitEnd.DONE, event.prediction)


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def wait_or_disconnect(
    request: Request, events: EventLog, prediction_id: str, seconds: float
) -> Waited:
    waiter = asyncio.ensure_future(wait_for_done(events, prediction_id, seconds))
    watcher = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({waiter, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (waiter, watcher):
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
    if waiter.done() and not waiter.cancelled():
        return waiter.result() or Waited(WaitEnd.TIMED_OUT)
    return Waited(WaitEnd.CLIENT_LEFT)
