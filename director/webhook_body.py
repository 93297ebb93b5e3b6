"""Reading a request body as it streams: a webhook's reduced snapshot, or an upload's bytes.

:class:`Reading` wraps the request's chunks and remembers what went wrong *reading* them (the
runner went away, a malformed snapshot): an error the store raises while it consumes the
chunks is then told apart from one of the body itself, so only the store's own failures count
as output that cannot be kept.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, AsyncIterable, AsyncIterator, Awaitable, Callable

import orjson

from director.snapshot_events import Event, FileBytes, FileEnd, FileStart, Text
from director.snapshot_files import SnapshotScanner

#: Saves one output file's bytes; returns its URL.
Save = Callable[[FileStart, AsyncIterable[bytes]], Awaitable[str]]


class BodyTooLarge(Exception):
    """The reduced snapshot passed its limit."""


class Reading:
    """The chunks of one request body, with the error reading them raised, if any."""

    def __init__(self, chunks: AsyncIterable[bytes]) -> None:
        self._chunks = chunks
        #: What reading the body raised (not what its consumer raised).
        self.error: BaseException | None = None

    async def chunks(self) -> AsyncIterator[bytes]:
        iterator = aiter(self._chunks)
        while True:
            try:
                chunk = await anext(iterator)
            except StopAsyncIteration:
                return
            except Exception as error:
                self.error = error
                raise
            yield chunk


async def reduced_snapshot(
    reading: Reading, scanner: SnapshotScanner, max_body: int, save: Save
) -> bytes:
    """The snapshot body with its large data URLs saved as files (``save``) and replaced by
    their URLs, and its input echo dropped. Raises :class:`BodyTooLarge` past ``max_body``
    bytes, the scanner's ``ScanError`` (as ``reading.error`` too), or what ``save`` raises."""
    body = bytearray()
    async with contextlib.aclosing(_events(reading, scanner)) as events:
        async for event in events:
            if isinstance(event, Text):
                body += event.data
                if len(body) > max_body:
                    raise BodyTooLarge
            elif isinstance(event, FileStart):
                async with contextlib.aclosing(_file_bytes(events)) as data:
                    url = await save(event, data)
                body += orjson.dumps(url)
    return bytes(body)


async def _events(reading: Reading, scanner: SnapshotScanner) -> AsyncGenerator[Event, None]:
    try:
        async for chunk in reading.chunks():
            for event in scanner.feed(chunk):
                yield event
        for event in scanner.close():
            yield event
    except ValueError as error:  # ScanError
        reading.error = reading.error or error
        raise


async def _file_bytes(events: AsyncIterator[Event]) -> AsyncGenerator[bytes, None]:
    async for event in events:
        if isinstance(event, FileBytes):
            yield event.data
        elif isinstance(event, FileEnd):
            return
