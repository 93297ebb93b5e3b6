"""A ``multipart/form-data`` body read as a stream of events, never buffered whole.

python-multipart's push parser is fed the body as it arrives; what its callbacks report comes
out as events, in order: a :class:`Part` when a part's headers are read, ``bytes`` of its data
(as many pieces as the body arrives in), and ``None`` when the part ends. The caller pulls the
events, so a part's bytes go wherever it sends them (a file store) at the pace they arrive.

Nothing after the closing boundary is read: an epilogue, however long, is left unread (the
caller answers and closes the connection, see :attr:`FormStream.received`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass

from python_multipart.exceptions import MultipartParseError
from python_multipart.multipart import MultipartParser, parse_options_header

from api.errors import InvalidRequest

#: Longest header block of one part (bytes); a longer one is refused.
MAX_PART_HEADERS = 16 * 1024


@dataclass(frozen=True, slots=True)
class Part:
    """A part's headers: its form field name, file name and content type (as sent)."""

    name: str
    filename: str | None
    content_type: str | None


Event = Part | bytes | None


def boundary_of(content_type: str | None) -> bytes:
    """The boundary of a ``multipart/form-data`` Content-Type; 400 naming the header else."""
    kind, options = parse_options_header(content_type or "")
    boundary = options.get(b"boundary")
    if kind.lower() != b"multipart/form-data" or not boundary:
        message = "must be multipart/form-data with a boundary"
        raise InvalidRequest(
            f"Content-Type {message}.", errors=[{"field": "Content-Type", "message": message}]
        )
    return boundary


class FormStream:
    """Pulls ``body`` through the parser: iterate :meth:`events`."""

    def __init__(self, body: AsyncIterator[bytes], boundary: bytes) -> None:
        self._body = body
        self._pending: deque[Event] = deque()
        self._headers: dict[bytes, bytes] = {}
        self._field = bytearray()
        self._value = bytearray()
        self._header_bytes = 0
        self._ended = False
        #: Bytes of the body read so far; once the closing boundary is read, no more are.
        self.received = 0
        self._parser = MultipartParser(
            boundary,
            {
                "on_part_begin": self._part_begin,
                "on_header_field": self._header_field,
                "on_header_value": self._header_value,
                "on_header_end": self._header_end,
                "on_headers_finished": self._headers_finished,
                "on_part_data": self._part_data,
                "on_part_end": self._part_end,
                "on_end": self._end,
            },
        )

    async def events(self) -> AsyncIterator[Event]:
        async for chunk in self._body:
            self.received += len(chunk)
            try:
                self._parser.write(chunk)
            except MultipartParseError as error:
                raise _malformed(str(error)) from None
            while self._pending:
                yield self._pending.popleft()
            if self._ended:
                return
        try:
            self._parser.finalize()
        except MultipartParseError as error:
            raise _malformed(str(error)) from None
        while self._pending:
            yield self._pending.popleft()
        if not self._ended:
            raise _malformed("the body ended before its closing boundary")

    def _part_begin(self) -> None:
        self._headers = {}
        self._header_bytes = 0

    def _header_field(self, data: bytes, start: int, end: int) -> None:
        self._field += data[start:end]
        self._count(end - start)

    def _header_value(self, data: bytes, start: int, end: int) -> None:
        self._value += data[start:end]
        self._count(end - start)

    def _count(self, size: int) -> None:
        self._header_bytes += size
        if self._header_bytes > MAX_PART_HEADERS:
            raise MultipartParseError("a part's headers are too long")

    def _header_end(self) -> None:
        self._headers[bytes(self._field).lower()] = bytes(self._value)
        self._field.clear()
        self._value.clear()

    def _headers_finished(self) -> None:
        _, disposition = parse_options_header(self._headers.get(b"content-disposition"))
        name = disposition.get(b"name")
        filename = disposition.get(b"filename")
        content_type = self._headers.get(b"content-type")
        self._pending.append(
            Part(
                name=name.decode(errors="replace") if name is not None else "",
                filename=filename.decode(errors="replace") if filename is not None else None,
                content_type=content_type.decode("latin-1") if content_type else None,
            )
        )

    def _part_data(self, data: bytes, start: int, end: int) -> None:
        if end > start:
            self._pending.append(bytes(data[start:end]))

    def _part_end(self) -> None:
        self._pending.append(None)

    def _end(self) -> None:
        self._ended = True


def _malformed(why: str) -> InvalidRequest:
    message = f"not a valid multipart/form-data body: {why}"
    return InvalidRequest(f"The body is {message}.", errors=[{"field": "body", "message": message}])
