"""A prediction's snapshots written down the response of the request that started it.

A Conduit director asks for this with ``Accept: application/x-ndjson`` on its ``PUT``: the
runner then answers ``200`` with ``Content-Type: application/x-ndjson`` and one snapshot per
line -- the very bodies its webhooks would carry, in the same order -- and ends the response
after the terminal one. That spares each prediction the ``start`` and ``completed`` webhook
round trips (two HTTP exchanges, and the work of both ends). A stock Cog client never asks and
sees coglet's behaviour; a stock Cog server never answers so, and the director falls back to
webhooks.

A ``PUT`` with ``If-Match: *`` as well *attaches*: it is answered with the stream only if the
prediction is running here (``412`` otherwise, and nothing starts). A director that took over a
prediction whose previous director died follows the run that way instead of starting it again;
the snapshots go to the newest caller from then on, and the previous stream ends.

The stream is a transport, not a contract: if the connection goes away before the end (the
director restarted, a proxy cut it), whatever was not written yet goes to the request's
``webhook`` URL through the usual :class:`~runners.webhooks.WebhookSender`, as if the stream
had never been asked for. The director's receiver takes either, and snapshots are cumulative,
so one that arrives both ways changes nothing.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection
from typing import Any

import orjson
from aiohttp import web

from protocol.headers import NDJSON
from protocol.values import WebhookEvent
from runners.webhooks import SnapshotSink

log = logging.getLogger(__name__)

_CUMULATIVE = frozenset({WebhookEvent.OUTPUT, WebhookEvent.LOGS})


def wants_stream(accept: str | None) -> bool:
    """Whether an ``Accept`` header asks for the snapshot stream."""
    if not accept:
        return False
    return any(part.split(";")[0].strip().lower() == NDJSON for part in accept.split(","))


class SnapshotStream:
    """One prediction's snapshots, queued without blocking and written in order by
    :meth:`pump`, which runs in the request handler."""

    def __init__(self, events: Collection[WebhookEvent], fallback: SnapshotSink | None) -> None:
        self.events = frozenset(events)
        self._fallback = fallback
        self._pending: list[tuple[WebhookEvent, dict[str, Any]]] = []
        self._wake = asyncio.Event()
        self._detached = False
        self._closed = False

    def send(self, event: WebhookEvent, snapshot: dict[str, Any]) -> None:
        """Queue ``snapshot``; the terminal one (``completed``) always goes, as it ends the
        response. A newer output or logs snapshot replaces a queued one of the same kind that
        has not been written yet: snapshots are cumulative."""
        if self._closed:
            return
        if self._detached:
            if self._fallback is not None:
                self._fallback.send(event, snapshot)
            return
        if event is not WebhookEvent.COMPLETED and event not in self.events:
            return
        if event in _CUMULATIVE and self._pending and self._pending[-1][0] is event:
            self._pending[-1] = (event, snapshot)
        else:
            self._pending.append((event, snapshot))
        self._wake.set()

    async def pump(self, response: web.StreamResponse) -> None:
        """Write snapshots as they come until the terminal one is out, then end the response.

        If the connection fails or the handler is canceled (the client went away), what was
        not surely written goes to the fallback webhook from then on, and the error
        propagates.
        """
        batch: list[tuple[WebhookEvent, dict[str, Any]]] = []
        try:
            while True:
                if not self._pending:
                    if self._closed:
                        await response.write_eof()  # ends without a terminal snapshot
                        return
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                batch, self._pending = self._pending, []
                await response.write(
                    b"".join(
                        orjson.dumps(snapshot, option=orjson.OPT_SORT_KEYS) + b"\n"
                        for _, snapshot in batch
                    )
                )
                if batch[-1][0] is WebhookEvent.COMPLETED:
                    batch = []
                    await response.write_eof()
                    return
                batch = []
        except BaseException:
            self._detach(batch)
            raise

    def close(self) -> None:
        """Another caller took the prediction over: write what is queued, end the response
        without a terminal snapshot, and send nothing more, by either way."""
        self._closed = True
        self._wake.set()
        if self._fallback is not None:
            self._fallback.close()

    def _detach(self, unwritten: list[tuple[WebhookEvent, dict[str, Any]]]) -> None:
        self._detached = True
        if self._closed:
            return
        rest, self._pending = [*unwritten, *self._pending], []
        if self._fallback is None:
            if rest:
                log.warning("snapshot stream closed early and the request named no webhook")
            return
        for event, snapshot in rest:
            self._fallback.send(event, snapshot)
