"""Every status the gateway answers with, produced here: domain errors and their gRPC codes.

Handlers raise a :class:`GatewayError` subclass whose message names the field at fault
(``data: not valid JSON``); :func:`status_of` turns any exception into the (code, message) the
call is aborted with. A bad request is never ``UNKNOWN``: an exception the gateway did not
expect is ``INTERNAL`` and logged, and an outage of Postgres or Redis is ``UNAVAILABLE``.

==================  =====================================================================
INVALID_ARGUMENT    bad JSON, an input the block's schema refuses, a bad graph
UNAUTHENTICATED     no bearer token, or one that names no account
NOT_FOUND           an unknown block, or one the account may not use (the same answer)
RESOURCE_EXHAUSTED  a message over the limit, a file over the store's, the waiters full, a
                    task over quota (``retry-after`` in the trailing metadata)
UNAVAILABLE         no runner serves the block; the database, Redis or file store away
DEADLINE_EXCEEDED   the call's deadline (or the default) passed; the prediction is canceled
CANCELLED           the client canceled (the prediction is canceled too), or someone did
FAILED_PRECONDITION a replayed task whose answer was too large to keep
ABORTED             the model failed, or its prediction was aborted: the model's error
INTERNAL            what the gateway did not expect (logged)
==================  =====================================================================
"""

from __future__ import annotations

import logging
from typing import Any, NoReturn

import grpc

from core.transient import TRANSIENT, past_database_limit

log = logging.getLogger(__name__)


class GatewayError(Exception):
    """An answer other than OK; ``field`` (when given) is named first in the message;
    ``trailing`` is metadata sent with the status (``retry-after`` of a refusal over quota)."""

    code = grpc.StatusCode.INTERNAL

    def __init__(
        self,
        message: str,
        field: str | None = None,
        trailing: tuple[tuple[str, str], ...] = (),
    ) -> None:
        self.field = field
        self.message = f"{field}: {message}" if field else message
        self.trailing = trailing
        super().__init__(self.message)


class InvalidArgument(GatewayError):
    code = grpc.StatusCode.INVALID_ARGUMENT


class NotFound(GatewayError):
    code = grpc.StatusCode.NOT_FOUND


class Unauthenticated(GatewayError):
    code = grpc.StatusCode.UNAUTHENTICATED


class Unavailable(GatewayError):
    code = grpc.StatusCode.UNAVAILABLE


class ResourceExhausted(GatewayError):
    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class DeadlineExceeded(GatewayError):
    code = grpc.StatusCode.DEADLINE_EXCEEDED


class Cancelled(GatewayError):
    code = grpc.StatusCode.CANCELLED


class FailedPrecondition(GatewayError):
    code = grpc.StatusCode.FAILED_PRECONDITION


class Aborted(GatewayError):
    """The task ran and did not succeed: the model failed, or its prediction was aborted (the
    message carries the model's error)."""

    code = grpc.StatusCode.ABORTED


async def abort_with(
    context: grpc.aio.ServicerContext[Any, Any],
    error: BaseException,
    status: tuple[grpc.StatusCode, str] | None = None,
) -> NoReturn:
    """End the call with the status :func:`status_of` gives ``error`` (or ``status``, what it
    gave already), and its trailing metadata, such as a quota's ``retry-after``."""
    code, message = status or status_of(error)
    trailing = getattr(error, "trailing", ())
    if trailing:
        context.set_trailing_metadata(trailing)
    await context.abort(code, message)


def status_of(error: BaseException) -> tuple[grpc.StatusCode, str]:
    """The status a call that raised ``error`` ends with."""
    if isinstance(error, GatewayError):
        return error.code, error.message
    if past_database_limit(error):
        log.info("database refused a statement past its limits: %r", error)
        return grpc.StatusCode.INVALID_ARGUMENT, "the request is too complex for the database"
    if isinstance(error, TRANSIENT):
        log.warning("database or Redis unreachable: %r", error)
        return grpc.StatusCode.UNAVAILABLE, "the gateway's database or Redis is unreachable"
    log.error("unexpected error in a gateway call", exc_info=error)
    return grpc.StatusCode.INTERNAL, "internal error"
