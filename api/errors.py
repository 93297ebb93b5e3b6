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

How exceptions become these responses, and what database errors are answered with:
:mod:`api.error_handlers`.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from fastapi.responses import JSONResponse

from front.destinations import InvalidName, UnknownDestination
from lane import errors as lane_errors
from lane.events import RejectReason
from tracker.input_checks import RefusedInput

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


def unknown_destination(refused: UnknownDestination | InvalidName) -> Problem:
    """What the front door could not resolve: 422 naming the body's field that named it, else
    (named by the path) 404."""
    if refused.field is None:
        return NotFound(refused.detail)
    return InvalidInput(
        refused.detail, errors=[{"field": refused.field, "message": refused.reason}]
    )


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
