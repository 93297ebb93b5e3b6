"""Calls admitted before their messages are read: who is calling, and how many bytes are held.

gRPC reads a unary call's message whole (up to ``max_message_bytes``) before its handler runs,
so a check in the handler comes after an unauthenticated client has made the gateway receive
and parse what it sent. :class:`Admission`, a server interceptor, serves every method as one
whose requests stream instead, which lets it act before the first message is read:

1. A call to a method that needs an account (every one but :data:`PUBLIC`) is authenticated
   from its metadata (``authorization``) and its peer's address; refused (``UNAUTHENTICATED``,
   or ``RESOURCE_EXHAUSTED`` with ``retry-after`` for an address past its failed-auth budget),
   none of its message is read (gRPC's flow control, without bandwidth-delay probing, lets
   only a small window of it arrive meanwhile).
2. Each message is then read under a byte budget (:class:`ByteBudget`): the read reserves
   ``max_message_bytes`` until the message's size is known, then holds that size until the
   call ends (a stream's message until the next is read). Past the budget, reads wait. Public
   methods (health, ``ServerLive``, ...) read under a budget of their own, one message at a
   time, so unauthenticated calls never take the accounts' bytes. The budget bounds the
   gateway's own copies (the bytes read, the message parsed, the task made of it); the
   transport still buffers the message of each open stream, which the streams a connection
   may open (``max_concurrent_streams``) bound.

The account is the handler's through :func:`caller`. Concurrent streams per connection are
bounded by the server's ``grpc.max_concurrent_streams`` (``GatewaySettings``).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import inspect
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from catalog.records import AccountInfo
from gateway.errors import Unauthenticated, abort_with, status_of

#: Methods any client may call without a token; their messages are tiny.
PUBLIC = frozenset(
    {
        "/grpc.health.v1.Health/Check",
        "/grpc.health.v1.Health/Watch",
        "/inference.GRPCInferenceService/ServerLive",
        "/inference.GRPCInferenceService/ServerReady",
        "/inference.GRPCInferenceService/ServerMetadata",
    }
)

Context = grpc.aio.ServicerContext[Any, Any]
#: Who a call is, from its context (metadata and peer); raises a ``GatewayError`` to refuse.
Authenticate = Callable[[Context], Awaitable[AccountInfo]]
#: Told of a call refused before its message was read: its method, status, seconds taken.
Refused = Callable[[str, grpc.StatusCode, float], None]

_CALLER: contextvars.ContextVar[AccountInfo] = contextvars.ContextVar("gateway_caller")


def caller() -> AccountInfo:
    """The account :class:`Admission` authenticated the current call as."""
    try:
        return _CALLER.get()
    except LookupError:
        raise Unauthenticated("the call was not authenticated", "authorization") from None


class ByteBudget:
    """Bytes that may be held at once; takers wait, first come first served."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.free = total
        self._waiting: deque[tuple[int, asyncio.Future[None]]] = deque()

    async def take(self, size: int) -> None:
        size = min(size, self.total)
        if not self._waiting and self.free >= size:
            self.free -= size
            return
        granted = asyncio.get_running_loop().create_future()
        entry = (size, granted)
        self._waiting.append(entry)
        try:
            await granted
        except BaseException:
            if granted.done() and not granted.cancelled():
                self.give(size)  # granted as it was cancelled: handed on
            else:
                self._waiting.remove(entry)
                self._wake()
            raise

    def give(self, size: int) -> None:
        self.free = min(self.total, self.free + min(size, self.total))
        self._wake()

    def _wake(self) -> None:
        while self._waiting and self.free >= self._waiting[0][0]:
            size, granted = self._waiting.popleft()
            self.free -= size
            granted.set_result(None)


class _Held:
    """What one call holds of a budget."""

    def __init__(self, budget: ByteBudget) -> None:
        self.budget = budget
        self.size = 0

    async def read(self, requests: AsyncIterator[bytes], reserve: int) -> bytes | None:
        """The next raw message (None at the end), read with ``reserve`` bytes reserved; then
        its own size held instead (what was held before is given back first)."""
        self.release()
        await self.budget.take(reserve)
        self.size = min(reserve, self.budget.total)
        raw: bytes | None = None
        try:
            raw = await anext(requests, None)
        finally:
            kept = 0 if raw is None else min(len(raw), self.size)
            self.budget.give(self.size - kept)
            self.size = kept
        return raw

    def release(self) -> None:
        self.budget.give(self.size)
        self.size = 0


class Admission(grpc.aio.ServerInterceptor):
    def __init__(
        self,
        authenticate: Authenticate,
        max_message_bytes: int,
        max_bytes_in_flight: int,
        refused: Refused | None = None,
    ) -> None:
        self.authenticate = authenticate
        #: Told of each call refused here (its method, status and seconds taken).
        self.refused = refused
        self.max_message_bytes = max_message_bytes
        self.accounts = ByteBudget(max_bytes_in_flight)
        self.public = ByteBudget(max_message_bytes)

    async def intercept_service(
        self,
        continuation: Callable[
            [grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]
        ],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = await continuation(details)
        if handler is None:
            return handler
        if details.method in PUBLIC:
            return _streaming(handler, _anyone, self.public, self.max_message_bytes)
        admit = functools.partial(self._admit, details.method)
        return _streaming(handler, admit, self.accounts, self.max_message_bytes)

    async def _admit(self, method: str, context: Context) -> None:
        """Authenticate the call (the account for :func:`caller`), or end it."""
        started = time.monotonic()
        try:
            _CALLER.set(await self.authenticate(context))
        except asyncio.CancelledError:
            raise
        except Exception as error:
            status = status_of(error)
            if self.refused is not None:
                self.refused(method, status[0], time.monotonic() - started)
            await abort_with(context, error, status)


async def _anyone(context: Context) -> None:
    return None


async def _one(
    held: _Held, requests: AsyncIterator[bytes], reserve: int, deserialize: Callable[[bytes], Any]
) -> Any:
    """The one message, parsed (None when there is none); its raw bytes are not kept."""
    raw = await held.read(requests, reserve)
    return None if raw is None else deserialize(raw)


def _behaviour(handler: grpc.RpcMethodHandler[Any, Any]) -> Any:
    """The handler's own function, whichever of the four kinds it is."""
    if handler.response_streaming:
        return handler.stream_stream if handler.request_streaming else handler.unary_stream
    return handler.stream_unary if handler.request_streaming else handler.unary_unary


def _streaming(
    handler: grpc.RpcMethodHandler[Any, Any],
    admit: Callable[[Context], Awaitable[None]],
    budget: ByteBudget,
    reserve: int,
) -> grpc.RpcMethodHandler[Any, Any]:
    """``handler`` served with streaming requests: admitted before its first message is read,
    each message read under ``budget`` (``reserve`` bytes reserved until its size is known)."""
    deserialize: Callable[[bytes], Any] = handler.request_deserializer or (lambda raw: raw)
    original = _behaviour(handler)

    async def each(requests: AsyncIterator[bytes], held: _Held) -> AsyncIterator[Any]:
        while (raw := await held.read(requests, reserve)) is not None:
            yield deserialize(raw)
        held.release()

    @contextlib.asynccontextmanager
    async def admitted(requests: AsyncIterator[bytes], context: Context) -> AsyncIterator[Any]:
        await admit(context)
        held = _Held(budget)
        try:
            if handler.request_streaming:
                yield each(requests, held)
                return
            request = await _one(held, requests, reserve, deserialize)
            if request is None:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "no request message")
            yield request
        finally:
            held.release()

    async def generate(requests: AsyncIterator[bytes], context: Context) -> Any:
        async with admitted(requests, context) as request:
            async for response in original(request, context):
                yield response

    async def call(requests: AsyncIterator[bytes], context: Context) -> Any:
        async with admitted(requests, context) as request:
            return await original(request, context)

    serialize = handler.response_serializer
    if not handler.response_streaming:
        return grpc.stream_unary_rpc_method_handler(call, response_serializer=serialize)
    # A handler that yields its responses is wrapped by one that yields; one that writes them
    # (``context.write``) by one that awaits it: gRPC serves the two differently.
    streamed = generate if inspect.isasyncgenfunction(original) else call
    return grpc.stream_stream_rpc_method_handler(streamed, response_serializer=serialize)
