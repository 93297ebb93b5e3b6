"""How the API's exceptions become RFC 9457 problem+json answers (:mod:`api.errors` holds the
problems themselves): :func:`install` registers a handler for each kind.

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
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from redis.exceptions import RedisError
from sqlalchemy.exc import DataError, DBAPIError, IntegrityError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from starlette.exceptions import HTTPException as StarletteHTTPException

from api.errors import (
    Problem,
    RateLimited,
    invalid_input,
    lane_problem,
    problem_response,
    unknown_destination,
)
from core.transient import TRANSIENT, past_database_limit
from front.destinations import InvalidName, UnknownDestination
from lane import errors as lane_errors
from tracker.input_checks import RefusedInput
from tracker.rate_limits import OverRate

log = logging.getLogger(__name__)


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


async def _on_unknown_destination(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, UnknownDestination | InvalidName)
    return await _on_problem(request, unknown_destination(exc))


async def _on_refused_input(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RefusedInput)
    return await _on_problem(request, invalid_input(exc))


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


@dataclass(frozen=True, slots=True)
class _Refusal:
    """A database error that is the request's fault, and the answer it gets."""

    status: int
    title: str
    detail: str
    code: str | None = None


#: Postgres refused a value of the request (SQLSTATE class 22: a NUL character, a number or
#: date out of range).
_UNSTORABLE = _Refusal(
    400,
    "Invalid request",
    "The request holds a value the database cannot store (such as a NUL character).",
)
#: A constraint Postgres enforces (a concurrent create of the same name, say).
_CONFLICT = _Refusal(409, "Conflict", "The request conflicts with data already stored; retry it.")
#: A statement past Postgres's own limits (``core.transient.past_database_limit``).
_TOO_COMPLEX = _Refusal(
    400,
    "Invalid request",
    "The request is too large or too deeply nested for the database to evaluate.",
    code="too_complex",
)


def _refusal(exc: DBAPIError) -> _Refusal | None:
    if isinstance(exc, DataError):
        return _UNSTORABLE
    if isinstance(exc, IntegrityError):
        return _CONFLICT
    if past_database_limit(exc):
        return _TOO_COMPLEX
    return None


async def _on_database(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, DBAPIError)
    refusal = _refusal(exc)
    if refusal is not None:  # the request is at fault, and the database is fine
        log.info("database refused %s: %r", request.url.path, exc)
        return problem_response(
            refusal.status,
            refusal.title,
            refusal.detail,
            instance=request.url.path,
            code=refusal.code,
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
    # What the front door refuses (:mod:`front`), before anything is stored.
    app.add_exception_handler(UnknownDestination, _on_unknown_destination)
    app.add_exception_handler(InvalidName, _on_unknown_destination)
    app.add_exception_handler(RefusedInput, _on_refused_input)
    app.add_exception_handler(RequestValidationError, _on_validation)
    app.add_exception_handler(StarletteHTTPException, _on_http)
    app.add_exception_handler(DBAPIError, _on_database)
    app.add_exception_handler(PoolTimeout, _on_pool_timeout)
    app.add_exception_handler(RedisError, _on_backend)
    app.add_exception_handler(Exception, _on_unexpected)
