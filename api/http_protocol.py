"""uvicorn's httptools protocol, with the limits of :mod:`api.connections` applied to sockets.

uvicorn bounds none of these by itself: a fresh connection that sends nothing is held until
the client leaves (its keep-alive timeout starts only after a first answer), httptools
accumulates a header or URL of any size, a body may stop or drip for ever, and every request
pipelined behind one being answered is parsed and queued as it arrives, however many the
client sends without reading the answers. So this protocol:

- admits each connection through the process's :class:`~api.connections.ConnectionLedger`
  (503 and close when full, for the server or for the client's address);
- times each request head (408 when late; a silent close for a connection that sent nothing)
  and counts its bytes and fields (431);
- judges each body's pace (:class:`~api.connections.BodyPace`, 408 when too slow);
- drops a connection whose answers stay unread for ``send_timeout``;
- feeds the parser in slices and stops after ``max_pipelined`` waiting requests, keeping the
  rest of the read unparsed and the socket paused until answers go out.

Build the class for a server with :func:`guarded_protocol` and pass it as uvicorn's ``http``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, ClassVar

import httptools
import orjson
from uvicorn.config import Config
from uvicorn.protocols.http.flow_control import HIGH_WATER_LIMIT, FlowControl
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol
from uvicorn.server import ServerState

from api.connections import Admission, BodyPace, ConnectionLedger, ConnectionLimits, ConnectionsFull
from api.errors import PROBLEM_JSON

log = logging.getLogger(__name__)

#: Bytes handed to the parser at a time outside a body, so that a read holding many pipelined
#: requests is parsed only as far as the pipeline may grow (give or take the requests of one
#: slice), and a head's size is checked as it arrives (to within one slice).
HEAD_SLICE = 1024
#: The same inside a body, where the parser hands bytes on without a callback each.
BODY_SLICE = 8192


class HeadTooLarge(Exception):
    """Raised inside a parser callback to stop parsing a head with too many fields."""


class GatedFlow(FlowControl):
    """uvicorn's flow control, except that reading resumes only when ``may_read`` allows:
    uvicorn resumes it whenever an answer ends or the application waits for the body."""

    def __init__(self, transport: asyncio.Transport, may_read: Callable[[], bool]) -> None:
        super().__init__(transport)
        self._may_read = may_read

    def resume_reading(self) -> None:
        if self._may_read():
            super().resume_reading()


def problem_bytes(status: int, title: str, detail: str, *headers: tuple[str, str]) -> bytes:
    """A whole HTTP/1.1 problem+json answer that closes the connection, for what is refused
    before any application sees a request."""
    body = orjson.dumps({"type": "about:blank", "title": title, "status": status, "detail": detail})
    lines = [
        STATUS_LINE[status],
        f"content-type: {PROBLEM_JSON}\r\n".encode(),
        f"content-length: {len(body)}\r\n".encode(),
        *(f"{name}: {value}\r\n".encode() for name, value in headers),
        b"connection: close\r\n\r\n",
        body,
    ]
    return b"".join(lines)


class GuardedHttpProtocol(HttpToolsProtocol):
    """One client connection; ``limits`` and ``ledger`` are the server's (see
    :func:`guarded_protocol`)."""

    limits: ClassVar[ConnectionLimits]
    ledger: ClassVar[ConnectionLedger]

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self._admission: Admission | None = None
        self._refused = False
        #: Head: whether one is being read, its bytes so far, its fields, and its deadline.
        self._in_head = False
        self._heads = 0
        self._head_bytes = 0
        self._header_count = 0
        self._head_timer: asyncio.TimerHandle | None = None
        #: Body: whether one is being read, its pace and the timer that judges it.
        self._body_open = False
        self._pace: BodyPace | None = None
        self._body_timer: asyncio.TimerHandle | None = None
        self._send_timer: asyncio.TimerHandle | None = None
        #: What was read but not parsed, because the pipeline was full.
        self._unparsed = b""

    # Connection.

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.flow = GatedFlow(transport, self._may_read)
        admitted = self.ledger.admit(self.client[0] if self.client else "")
        if isinstance(admitted, ConnectionsFull):
            self._refused = True
            log.debug("connection from %s refused: %s", self.client, admitted.name)
            transport.write(
                problem_bytes(503, "Service unavailable", admitted.value, ("retry-after", "1"))
            )
            transport.close()
            return
        self._admission = admitted
        self._head_timer = self.loop.call_later(self.limits.head_timeout, self._head_late)

    def connection_lost(self, exc: Exception | None) -> None:
        for timer in (self._head_timer, self._body_timer, self._send_timer):
            if timer is not None:
                timer.cancel()
        self._head_timer = self._body_timer = self._send_timer = None
        self._unparsed = b""
        if self._admission is not None:
            self.ledger.release(self._admission)
            self._admission = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        if self._unparsed:  # reading is paused; what was already on its way comes after
            self._unparsed += data
            self.flow.pause_reading()
            return
        self._feed(data)

    def _feed(self, data: bytes) -> None:
        """Parse ``data`` a slice at a time, keeping back what the pipeline has no room for."""
        self._unset_keepalive_if_required()
        view = memoryview(data)
        offset = 0
        while offset < len(view):
            if self._pipeline_full():
                self._unparsed = bytes(view[offset:])
                self.flow.pause_reading()
                return
            piece = view[offset : offset + (BODY_SLICE if self._body_open else HEAD_SLICE)]
            offset += len(piece)
            head = self._heads if self._in_head else None
            if not self._parse(piece):
                return
            if self._in_head and head == self._heads:  # all of this slice was head
                self._head_bytes += len(piece)
                if self._head_bytes > self.limits.max_head_bytes:
                    self._refuse_head(f"longer than {self.limits.max_head_bytes} bytes")
                    return
        if self._body_open and self._body_timer is None:
            self._pace = BodyPace(self.limits.body_timeout, self.limits.body_min_rate, self._now())
            self._body_timer = self.loop.call_later(self.limits.body_timeout, self._judge_body)

    def _parse(self, piece: memoryview) -> bool:
        """Feed the parser; False when the connection is done with (refused or handed off)."""
        try:
            self.parser.feed_data(piece)
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:  # served as plain HTTP; uvicorn's warning would be the client's to write
                log.debug("upgrade request from %s not upgraded", self.client)
            return False
        except httptools.HttpParserError as error:
            if isinstance(error.__context__, HeadTooLarge):
                self._refuse_head(f"more than {self.limits.max_headers} header fields")
            else:
                self.logger.warning("Invalid HTTP request received.")
                self.send_400_response("Invalid HTTP request received.")
            return False
        return True

    def _pipeline_full(self) -> bool:
        return len(self.pipeline) >= self.limits.max_pipelined

    def _may_read(self) -> bool:
        if self._unparsed or self._pipeline_full():
            return False
        # A request waiting in the pipeline gets its body buffered by the server until its
        # turn: no more than uvicorn buffers for the request being answered.
        return not (self.pipeline and len(self.cycle.body) > HIGH_WATER_LIMIT)

    def _now(self) -> float:
        return self.loop.time()

    # Parser callbacks.

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head = True
        self._heads += 1
        self._head_bytes = 0
        self._header_count = 0
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(self.limits.head_timeout, self._head_late)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_count += 1
        if self._header_count > self.limits.max_headers:
            raise HeadTooLarge()
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_head = False
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        self._body_open = True
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        if self._pace is not None:
            self._pace.received(len(body))
        super().on_body(body)

    def on_message_complete(self) -> None:
        self._body_open = False
        self._pace = None
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None
        super().on_message_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.transport.is_closing():
            return
        if self._unparsed and not self._pipeline_full():
            unparsed, self._unparsed = self._unparsed, b""
            self._feed(unparsed)
        # uvicorn tried to resume before it took the next request off the pipeline.
        self.flow.resume_reading()

    # Writing.

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._send_timer is None:
            self._send_timer = self.loop.call_later(self.limits.send_timeout, self._unread)

    def resume_writing(self) -> None:
        super().resume_writing()
        if self._send_timer is not None:
            self._send_timer.cancel()
            self._send_timer = None

    # Limits reached.

    def _head_late(self) -> None:
        self._head_timer = None
        if self.transport.is_closing():
            return
        if self.flow.read_paused:  # the server stopped reading (a full pipeline): not late
            self._head_timer = self.loop.call_later(self.limits.head_timeout, self._head_late)
            return
        log.debug("request head from %s late", self.client)
        if self._in_head and self._may_answer():
            self._answer_and_close(408, "Request timeout", "The request head came too slowly.")
        else:  # nothing sent yet: no request to answer
            self.transport.close()

    def _refuse_head(self, why: str) -> None:
        log.debug("request head from %s refused: %s", self.client, why)
        if not self._may_answer():  # an answer to an earlier request is under way
            self.transport.abort()
            return
        self._answer_and_close(
            431, "Request header fields too large", f"The request head is {why}."
        )

    def _judge_body(self) -> None:
        self._body_timer = None
        if self.transport.is_closing() or not self._body_open or self._pace is None:
            return
        # Not the client's delay: the server stopped reading, or the client waits for the
        # "100 Continue" the server sends once the application asks for the body.
        waiting = self.flow.read_paused or self.cycle.waiting_for_100_continue
        if not self._pace.too_slow(self._now(), waiting):
            self._body_timer = self.loop.call_later(self.limits.body_timeout, self._judge_body)
            return
        log.debug("request body from %s too slow", self.client)
        cycle = self.cycle
        answerable = not self.pipeline and cycle is not None and not cycle.response_started
        if cycle is not None and not cycle.response_complete:
            # The application stops waiting for the body, and whatever it answers is dropped.
            cycle.disconnected = True
            cycle.message_event.set()
        if answerable:
            self._answer_and_close(
                408, "Request timeout", "The request body came too slowly; send it again."
            )
        else:
            self.transport.close()

    def _unread(self) -> None:
        self._send_timer = None
        log.debug("answers to %s unread for %ss", self.client, self.limits.send_timeout)
        # Not close(): it would wait to send what is buffered, which nobody reads.
        self.transport.abort()

    def _may_answer(self) -> bool:
        """Whether an answer of the server's own would come after every other one."""
        return not self.pipeline and (self.cycle is None or self.cycle.response_complete)

    def _answer_and_close(self, status: int, title: str, detail: str) -> None:
        self.transport.write(problem_bytes(status, title, detail))
        self.transport.close()


def guarded_protocol(limits: ConnectionLimits) -> type[GuardedHttpProtocol]:
    """A protocol class for one server: its connections share one ledger."""

    class ConnectionGuard(GuardedHttpProtocol):
        pass

    ConnectionGuard.limits = limits
    ConnectionGuard.ledger = ConnectionLedger(limits)
    return ConnectionGuard
