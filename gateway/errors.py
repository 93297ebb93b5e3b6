"""Every status the gateway answers with, produced here: domain errors and their gRPC codes.

Handlers raise a :class:`GatewayError` subclass whose message names the field at fault
(``data: not valid JSON``); :func:`status_of` turns any exception into the (code, message) the
call is aborted with. A bad request is never ``UNKNOWN``: an exception the gateway did not
expect is ``INTERNAL`` and logged, and an outage of Postgres or Redis is ``UNAVAILABLE``.
"""

from __future__ import annotations

import logging

import grpc

from core.transient import TRANSIENT

log = logging.getLogger(__name__)


class GatewayError(Exception):
    """An answer other than OK; ``field`` (when given) is named first in the message."""

    code = grpc.StatusCode.INTERNAL

    def __init__(self, message: str, field: str | None = None) -> None:
        self.field = field
        self.message = f"{field}: {message}" if field else message
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


def status_of(error: BaseException) -> tuple[grpc.StatusCode, str]:
    """The status a call that raised ``error`` ends with."""
    if isinstance(error, GatewayError):
        return error.code, error.message
    if isinstance(error, TRANSIENT):
        log.warning("database or Redis unreachable: %r", error)
        return grpc.StatusCode.UNAVAILABLE, "the gateway's database or Redis is unreachable"
    log.error("unexpected error in a gateway call", exc_info=error)
    return grpc.StatusCode.INTERNAL, "internal error"
