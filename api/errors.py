"""Every error the API returns is RFC 9457 problem+json, produced here and nowhere else.

Exception tree::

    Problem                 any error with an HTTP status; routes raise its subclasses
    ├── Unauthenticated     401: missing or unknown bearer token, or a stream URL's signature
    │                            that no key made (``code: "invalid_signature"``)
    ├── Forbidden           403: a genuine stream URL past its expiry
    │                            (``code: "expired_signature"``)
    ├── NotFound            404: unknown resource, or another account's prediction
    ├── InvalidRequest      400: malformed JSON or a body of the wrong shape
    ├── InvalidInput        422: a field failed validation (``errors`` names each field)
    ├── Conflict            409: the request collides with one still in progress (may carry
    │                            Retry-After), e.g. a create reusing an ``Idempotency-Key``
    ├── PayloadTooLarge     413: body over ``max_body_bytes``
    ├── UnsupportedEncoding 415: a body sent with a ``Content-Encoding`` (never decoded;
    │                            ``code: "unsupported_content_encoding"``)
    ├── RateLimited         429: too many failed authentications from the client's address, or
    │                            an account past its rate of creates or uploads
    │                            (``tracker.rate_limits.OverRate``; ``code: "rate_limited"``,
    │                            with Retry-After)
    ├── OutOfCapacity       429: the synchronous lane has no permit for a ``/run``
    │                            (``code: "out_of_capacity"``, with Retry-After)
    ├── RunnerFailed        502: a ``/run`` failed on its runner(s) (``code: "runner_failed"``)
    ├── Unavailable         503: Postgres or Redis unreachable (with Retry-After)
    └── RunnerUnavailable   503: every runner of a ``/run``'s destination refused this
                                 server's runner token (``code: "runner_unavailable"``, with
                                 Retry-After): the platform's misconfiguration, no run recorded

A problem may carry ``code``, a stable machine-readable name beside the human ``detail``.

The synchronous lane's refusals (``lane.errors``) are mapped here (:func:`lane_problem`): its
``OutOfCapacity``, ``RunFailed`` and ``RunnerUnavailable`` to the problems above,
``LaneNotRunning`` to a 503.
An input ``tracker.input_checks`` refuses (``RefusedInput``) is an ``InvalidInput`` naming the
same fields (:func:`invalid_input`).

Database errors: only a connection-level failure (``core.transient.TRANSIENT``) is a 503, and so
is a wait for a pooled connection that ran out (``CONDUIT_DATABASE_POOL_TIMEOUT``: every
connection busy, e.g. behind a lock another client holds): an outage, never a 500. A value
Postgres refuses to store (``DataError``, e.g. a NUL character in a path) is a 400, a
constraint it enforces (``IntegrityError``) a 409, a statement past Postgres's own limits (too
complex, too deep: ``core.transient.past_database_limit``) a 400 ``too_complex``; any other is a
500: never "unreachable".
"""

from __future__ import annotations

import logging
from typing import Any, ClassVar, Literal

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from redis.exceptions import RedisError
from sqlalchemy.exc import DataError, DBAPIError, IntegrityError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from starlette.exceptions import HTTPException as StarletteHTTPException

from core.transient import TRANSIENT, past_database_limit
from lane import errors as lane_errors
from lane.events import RejectReason
from tracker.input_checks import RefusedInput
from tracker.rate_limits import OverRate

log = logging.getLogger(__name__)
PROBLEM_JSON = "application/problem+json"


class Problem(Exception):
    """Any error with an HTTP status; routes raise its subclasses.

    Each subclass's docstring (when it is answered), ``codes`` and ``sends_retry_after`` make
    the error reference (``conduit.errors_doc``)."""

    status = 500
    title = "Internal Server Error"
    type = "about:blank"
    #: The ``code`` values it may carry (none: it carries no ``code``).
    codes: ClassVar[tuple[str, ...]] = ()
    #: Whether its answer carries a ``Retry-After`` header.
    sends_retry_after: ClassVar[Literal["always", "sometimes", "never"]] = "never"

    def __init__(
        self,
        detail: str,
        *,
        errors: list[dict[str, Any]] | None = None,
        headers: dict[str, str] | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(detail)
        self.detail = detail
        self.errors = errors
        self.headers = headers or {}
        self.code = code


class Unauthenticated(Problem):
    """A missing or unknown bearer token, or a stream URL's signature that no key made
    (``invalid_signature``)."""

    status = 401
    title = "Unauthenticated"
    codes = ("invalid_signature",)

    def __init__(
        self,
        detail: str = "You did not pass a valid authentication token",
        code: str | None = None,
    ) -> None:
        super().__init__(detail, headers={"WWW-Authenticate": "Bearer"}, code=code)


class Forbidden(Problem):
    """The account may not do this: change another's model or block, an admin's action, act
    on ``/ops`` from a read-only account (``read_only``) or with a stale form token; or a
    genuine stream or file URL past its expiry (``expired_signature``)."""

    status = 403
    title = "Forbidden"
    codes = ("expired_signature", "read_only")


class NotFound(Problem):
    """An unknown resource, or another account's prediction (the same answer)."""

    status = 404
    title = "Not found"


class InvalidRequest(Problem):
    """Malformed JSON, a body of the wrong shape, or a header, cursor or query parameter
    that cannot be read."""

    status = 400
    title = "Invalid request"


class InvalidInput(Problem):
    """A field failed validation (``errors`` names each field), or an ``Idempotency-Key``
    reused with a different request."""

    status = 422
    title = "Invalid input"


def invalid_input(refused: RefusedInput) -> InvalidInput:
    """The 422 an input refused by ``tracker.input_checks`` is answered with, naming each
    field in ``errors``."""
    errors = [{"field": e.field, "message": e.message} for e in refused.errors]
    return InvalidInput(refused.detail, errors=errors)


class Conflict(Problem):
    """The request collides with another or with what is stored: a create reusing an
    ``Idempotency-Key`` whose first request is still in progress (with Retry-After), a name
    taken, something still in use."""

    status = 409
    title = "Conflict"
    sends_retry_after = "sometimes"

    def __init__(
        self,
        detail: str,
        *,
        errors: list[dict[str, Any]] | None = None,
        retry_after: int | None = None,
    ) -> None:
        headers = {"Retry-After": str(retry_after)} if retry_after is not None else None
        super().__init__(detail, errors=errors, headers=headers)


class PayloadTooLarge(Problem):
    """A body over ``max_body_bytes``."""

    status = 413
    title = "Request body too large"


class UnsupportedEncoding(Problem):
    """A body sent with a ``Content-Encoding``: bodies are never decoded."""

    status = 415
    title = "Unsupported Media Type"
    codes = ("unsupported_content_encoding",)

    def __init__(self, encoding: str) -> None:
        detail = f"Request bodies are not decoded: send it without Content-Encoding ({encoding!r})."
        super().__init__(
            detail,
            errors=[{"field": "Content-Encoding", "message": detail}],
            # RFC 9110 §15.5.16: the codings that would have been accepted.
            headers={"Accept-Encoding": "identity"},
            code="unsupported_content_encoding",
        )


class RateLimited(Problem):
    """Too many failed authentications from the client's address, or an account past its
    rate of creates or uploads."""

    status = 429
    title = "Too many requests"
    codes = ("rate_limited",)
    sends_retry_after = "always"

    def __init__(self, detail: str, retry_after: int) -> None:
        super().__init__(detail, headers={"Retry-After": str(retry_after)}, code="rate_limited")


class Unavailable(Problem):
    """Postgres, Redis or the file store unreachable, this server holding its most waiting
    clients, or a part this server does not run (files, the synchronous lane)."""

    status = 503
    title = "Service unavailable"
    sends_retry_after = "always"

    def __init__(self, detail: str, retry_after: int = 5) -> None:
        super().__init__(detail, headers={"Retry-After": str(retry_after)})


class OutOfCapacity(Problem):
    """The synchronous lane has no permit for a ``/run``: its queue is full, no runner freed
    up in time, or no runner serves the model now."""

    status = 429
    title = "Too Many Requests"
    codes = ("out_of_capacity",)
    sends_retry_after = "always"

    _DETAIL = {
        RejectReason.OUT_OF_CAPACITY: "Capacity temporarily exceeded: the queue is full.",
        RejectReason.EXPIRED: "Capacity temporarily exceeded: no runner freed up in time.",
        RejectReason.NO_RUNNER: "No runner serves this model now.",
    }

    def __init__(self, reason: RejectReason, retry_after: int) -> None:
        super().__init__(
            self._DETAIL[reason], headers={"Retry-After": str(retry_after)}, code="out_of_capacity"
        )


class RunnerFailed(Problem):
    """A ``/run`` failed on its runner(s)."""

    status = 502
    title = "Bad Gateway"
    codes = ("runner_failed",)

    def __init__(self, detail: str) -> None:
        super().__init__(detail, code="runner_failed")


class RunnerUnavailable(Problem):
    """Every runner of a ``/run``'s destination refused this server's runner token: the
    platform's misconfiguration; nothing was run or recorded."""

    status = 503
    title = "Service unavailable"
    codes = ("runner_unavailable",)
    sends_retry_after = "always"

    def __init__(self, retry_after: int) -> None:
        super().__init__(
            "No runner can take this run: its runners refused this server's runner token "
            "(CONDUIT_RUNNER_TOKEN differs between the api and the runner), so they are out of "
            "service (the operator page shows them) until one answers again. Nothing was run "
            "or recorded.",
            headers={"Retry-After": str(retry_after)},
            code="runner_unavailable",
        )


def lane_problem(error: lane_errors.LaneError) -> Problem:
    """The problem a refusal of the synchronous lane is answered with."""
    if isinstance(error, lane_errors.OutOfCapacity):
        return OutOfCapacity(error.reason, error.retry_after_s)
    if isinstance(error, lane_errors.RunnerUnavailable):
        return RunnerUnavailable(error.retry_after_s)
    if isinstance(error, lane_errors.RunFailed):
        return RunnerFailed(error.detail)
    return Unavailable("The synchronous lane is not running on this server.")


def problem_response(
    status: int,
    title: str,
    detail: str,
    *,
    instance: str | None = None,
    errors: list[dict[str, Any]] | None = None,
    headers: dict[str, str] | None = None,
    type: str = "about:blank",
    code: str | None = None,
) -> JSONResponse:
    body: dict[str, Any] = {"type": type, "title": title, "status": status, "detail": detail}
    if instance:
        body["instance"] = instance
    if code:
        body["code"] = code
    if errors:
        body["errors"] = errors
    return JSONResponse(body, status_code=status, headers=headers, media_type=PROBLEM_JSON)


def _field(loc: tuple[Any, ...]) -> str:
    parts = [str(p) for p in loc if p != "body"]
    return ".".join(parts) or "body"


async def _on_problem(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, Problem)
    return problem_response(
        exc.status,
        exc.title,
        exc.detail,
        instance=request.url.path,
        errors=exc.errors,
        headers=exc.headers,
        code=exc.code,
    )


async def _on_over_rate(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, OverRate)
    # One at a time (the api's creates and uploads) always fits once on schedule.
    return await _on_problem(request, RateLimited(exc.detail, exc.retry_after or 1))


async def _on_lane(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, lane_errors.LaneError)
    return await _on_problem(request, lane_problem(exc))


async def _on_validation(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = [{"field": _field(tuple(e["loc"])), "message": e["msg"]} for e in exc.errors()]
    if any(e.get("type") == "json_invalid" for e in exc.errors()):
        return problem_response(
            400,
            "Invalid request",
            "The body is not valid JSON.",
            instance=request.url.path,
            errors=errors,
        )
    detail = "; ".join(f"{e['field']}: {e['message']}" for e in errors)
    return problem_response(
        422, "Invalid request", detail, instance=request.url.path, errors=errors
    )


def undecodable_body(error: UnicodeDecodeError) -> RequestValidationError:
    """A body whose bytes are not text (UTF-8, or UTF-16/32 after a BOM), refused as FastAPI
    refuses JSON it cannot parse: a 400 naming where the bytes went wrong."""
    invalid = {
        "type": "json_invalid",
        "loc": ("body", error.start),
        "msg": "JSON decode error",
        "input": {},
        "ctx": {"error": f"not valid {error.encoding}: {error.reason}"},
    }
    return RequestValidationError([invalid])


async def _on_http(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    if isinstance(exc.__cause__, UnicodeDecodeError):
        # FastAPI's "error parsing the body" for bytes that are not text.
        return await _on_validation(request, undecodable_body(exc.__cause__))
    title = {404: "Not found", 405: "Method not allowed"}.get(exc.status_code, "Error")
    return problem_response(
        exc.status_code,
        title,
        str(exc.detail),
        instance=request.url.path,
        headers=dict(exc.headers or {}),
    )


async def _on_unstorable(request: Request, exc: Exception) -> JSONResponse:
    """Postgres refused a value of the request (SQLSTATE class 22: a NUL character, a number
    or date out of range): the request is at fault, and the database is fine."""
    log.info("database refused a value on %s: %r", request.url.path, exc)
    return problem_response(
        400,
        "Invalid request",
        "The request holds a value the database cannot store (such as a NUL character).",
        instance=request.url.path,
    )


async def _on_database(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, DBAPIError)
    if isinstance(exc, DataError):
        return await _on_unstorable(request, exc)
    if isinstance(exc, IntegrityError):
        log.info("database constraint on %s: %r", request.url.path, exc)
        return problem_response(
            409,
            "Conflict",
            "The request conflicts with data already stored; retry it.",
            instance=request.url.path,
        )
    if past_database_limit(exc):
        log.info("database refused a statement past its limits on %s: %r", request.url.path, exc)
        return problem_response(
            400,
            "Invalid request",
            "The request is too large or too deeply nested for the database to evaluate.",
            instance=request.url.path,
            code="too_complex",
        )
    if isinstance(exc, TRANSIENT) or exc.connection_invalidated:
        return await _on_backend(request, exc)
    return await _on_unexpected(request, exc)


async def _on_backend(request: Request, exc: Exception) -> JSONResponse:
    log.warning("backend unavailable on %s: %r", request.url.path, exc)
    which = "database" if isinstance(exc, DBAPIError) else "queue"
    return problem_response(
        503,
        "Service unavailable",
        f"The {which} is unreachable; retry shortly.",
        instance=request.url.path,
        headers={"Retry-After": "5"},
    )


async def _on_pool_timeout(request: Request, exc: Exception) -> JSONResponse:
    """No database connection came free in time: the database is slow or something holds it
    (a lock), not this request's fault, and a retry shortly may well succeed."""
    log.warning("database busy on %s: %r", request.url.path, exc)
    return problem_response(
        503,
        "Service unavailable",
        "The database is busy; retry shortly.",
        instance=request.url.path,
        headers={"Retry-After": "5"},
    )


async def _on_unexpected(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error on %s", request.url.path)
    return problem_response(
        500, "Internal Server Error", "An unexpected error occurred.", instance=request.url.path
    )


def install(app: FastAPI) -> None:
    app.add_exception_handler(Problem, _on_problem)
    app.add_exception_handler(lane_errors.LaneError, _on_lane)
    app.add_exception_handler(OverRate, _on_over_rate)
    app.add_exception_handler(RequestValidationError, _on_validation)
    app.add_exception_handler(StarletteHTTPException, _on_http)
    app.add_exception_handler(DBAPIError, _on_database)
    app.add_exception_handler(PoolTimeout, _on_pool_timeout)
    app.add_exception_handler(RedisError, _on_backend)
    app.add_exception_handler(Exception, _on_unexpected)
