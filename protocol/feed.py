"""The snapshots a Conduit runner writes down the response to a prediction request."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import aiohttp

from protocol.documents import PredictionResponse

log = logging.getLogger(__name__)


class SnapshotFeed:
    """The snapshots a Conduit runner writes down the response to a start or a synchronous
    call (``Accept: application/x-ndjson``, ``runners.streaming``): the bodies its webhooks
    would carry, one JSON document per line.

    Lines are split here rather than by ``StreamReader.readline``, whose line limit is far
    below the size of an output a model may return.
    """

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self._response = response

    async def snapshots(self) -> AsyncIterator[PredictionResponse]:
        """Each snapshot as it arrives, until the runner ends the response. A line that does
        not parse is logged and skipped; a broken connection ends the iteration with
        ``aiohttp.ClientError``."""
        buffer = bytearray()
        async for chunk in self._response.content.iter_any():
            buffer += chunk
            while (end := buffer.find(b"\n")) >= 0:
                line = bytes(buffer[:end])
                del buffer[: end + 1]
                if not line.strip():
                    continue
                try:
                    yield PredictionResponse.model_validate_json(line)
                except ValueError as error:
                    log.warning("bad snapshot line from runner: %s", error)

    def close(self) -> None:
        """Give the connection back (or drop it, when the stream did not end)."""
        self._response.release()
