"""The OpenAPI document served at ``/openapi.json``, as generated clients and test tools read it.

Routes declare what they answer: their body (``response_model``, documentation only, since they
return rendered responses), the problems they may return (:func:`problems`), their security and
headers (:func:`operation`). :func:`install` makes the document from them and puts in what
FastAPI would get wrong on its own: the ``Problem`` schema and the bearer scheme, and no
``HTTPValidationError`` (this API answers invalid requests with problem+json, see
``api.errors``).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

from api.errors import PROBLEM_JSON
from api.schemas import Problem
from tracker.priority import Priority

BEARER = "bearer"
_SCHEMAS = "#/components/schemas/"

_PROBLEMS: dict[int, str] = {
    400: "The request is malformed: invalid JSON, a header or cursor that cannot be read, or a "
    "value the database cannot store (a NUL character).",
    401: "No bearer token, or one that names no active account.",
    403: "The stream URL's signature is genuine but past its expiry (code expired_signature).",
    404: "No such resource, or it belongs to another account.",
    409: "A create with this Idempotency-Key is still in progress; retry after Retry-After.",
    413: "The request body is larger than the server accepts.",
    422: "A field of the request failed validation; errors names each one.",
    429: "Too many failed authentications from this address, or on a create too many creates "
    "by this account (code rate_limited); retry after Retry-After. A token this server has "
    "already verified is not refused for failed authentications.",
    502: "The runner failed the call, on every attempt the lane allowed (code runner_failed).",
    503: "Postgres or Redis is unreachable; retry after Retry-After.",
}


def _header(description: str, schema: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"description": description, "schema": schema or {"type": "string"}}


_RETRY_AFTER = _header("Seconds to wait before retrying.", {"type": "integer"})
_PROBLEM_HEADERS: dict[int, dict[str, Any]] = {
    401: {"WWW-Authenticate": _header('"Bearer".')},
    409: {"Retry-After": _RETRY_AFTER},
    429: {"Retry-After": _RETRY_AFTER},
    503: {"Retry-After": _RETRY_AFTER},
}


def problems(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """``responses=`` entries for the problem+json errors a route may answer."""
    responses: dict[int | str, dict[str, Any]] = {}
    for status in statuses:
        response: dict[str, Any] = {
            "description": _PROBLEMS[status],
            "content": {PROBLEM_JSON: {"schema": {"$ref": _SCHEMAS + "Problem"}}},
        }
        if status in _PROBLEM_HEADERS:
            response["headers"] = _PROBLEM_HEADERS[status]
        responses[status] = response
    return responses


def header_parameter(
    name: str, description: str, schema: dict[str, Any] | None = None
) -> dict[str, Any]:
    return {"name": name, "in": "header", "required": False, **_header(description, schema)}


CREATE_HEADERS = (
    header_parameter(
        "Prefer",
        "wait or wait=N (1 to 60 seconds): answer when the prediction finishes or the wait "
        'ends, whichever is first; a wait that ends first answers status "starting". '
        "Other preferences are ignored.",
    ),
    header_parameter(
        "Idempotency-Key",
        "Retrying a create with the same key and request gives back the first prediction "
        "(Idempotent-Replayed: true) instead of making another; the same key with another "
        "request is refused (422).",
        {"type": "string", "minLength": 1, "maxLength": 255},
    ),
    header_parameter(
        "Cancel-After",
        "A deadline, as a duration (30s, 5m, 1h30m; a bare number is seconds; at most 7 days): "
        "past it the prediction is canceled, or aborted if it has not started.",
    ),
    header_parameter(
        "X-Priority",
        "How urgent the prediction is; overrides the deployment's priority.",
        {"type": "string", "enum": [p.value for p in Priority]},
    ),
)

#: ``/run`` (the synchronous lane): what it reads besides the body.
RUN_REQUEST_HEADERS = (
    header_parameter(
        "Cancel-After",
        "A deadline, as a duration (30s, 5m; a bare number is seconds): a run still waiting "
        "for a runner then is refused (429 out_of_capacity).",
    ),
    header_parameter(
        "X-Priority",
        "How urgent the run is: higher bands get runners first.",
        {"type": "string", "enum": [p.value for p in Priority]},
    ),
)

#: Headers of a ``/run`` answer.
RUN_HEADERS: dict[str, Any] = {
    "X-Queue-Wait-Ms": _header(
        "Milliseconds the run waited for a runner: in the lane, plus inside the runner.",
        {"type": "integer"},
    ),
    "X-Conduit-Attempts": _header(
        "Runners called (2 when the first refused or failed).", {"type": "integer"}
    ),
    "X-Processing-Time": _header("Seconds this server spent on the request."),
    "X-Remote-Processing-Time": _header("Seconds the runner spent on it, as it says."),
    "X-GPU-Time-Ms": _header("The runner's GPU milliseconds, as it says."),
    "X-Cache-Hit": _header("The runner's cache hit (true or false), as it says."),
    "X-Cache-Tokens-Reused": _header("Tokens the runner's cache reused, as it says."),
}

#: ``/run``'s 429: the lane's, or the authentication budget's.
OUT_OF_CAPACITY: dict[str, Any] = {
    **problems(429)[429],
    "description": "No capacity now (code out_of_capacity): the queue is full, no runner "
    "freed up before the run's turn expired, or no runner serves the model; or too many "
    "failed authentications from this address (code rate_limited). Retry after Retry-After.",
}

LAST_EVENT_ID = header_parameter(
    "Last-Event-ID",
    "Resume after this event id (as sent in id: lines); others are refused (400).",
    {"type": "string", "pattern": r"^[0-9]+-[0-9]+$"},
)

#: One server-sent event of a prediction's stream, as ``itemSchema`` (how FastAPI and OpenAPI
#: 3.2 describe each event of a ``text/event-stream``).
STREAM_EVENT: dict[str, Any] = {
    "type": "object",
    "required": ["event", "data", "id"],
    "properties": {
        "event": {"type": "string", "enum": ["output", "logs", "error", "done"]},
        "data": {
            "type": "string",
            "description": "output: one output chunk (JSON unless it is a string); logs: log "
            'text; error: {"detail": ...}; done: {} or {"reason": "canceled" | "aborted"}.',
        },
        "id": {"type": "string", "pattern": r"^[0-9]+-[0-9]+$"},
    },
}

CREATED_HEADERS: dict[str, Any] = {
    "Location": _header("The prediction's URL (urls.get)."),
    "Idempotent-Replayed": _header("true when an Idempotency-Key gave back an earlier create."),
    "Preference-Applied": _header("The Prefer: wait that was applied."),
}


def operation(
    *headers: dict[str, Any], auth: bool = True, anonymous: bool = False
) -> dict[str, Any]:
    """``openapi_extra=`` for a route: its bearer security and the headers it reads.

    ``anonymous``: the bearer token is one way in, and the request may also go without it (a
    stream's capability URL carries its own credential)."""
    extra: dict[str, Any] = {}
    if auth:
        extra["security"] = [{BEARER: []}, {}] if anonymous else [{BEARER: []}]
    if headers:
        extra["parameters"] = list(headers)
    return extra


#: The request bodies routes read themselves (``api.bodies``), by schema name: the document
#: lists them under ``components`` as FastAPI lists a declared body.
_BODIES: dict[str, type[BaseModel]] = {}


def request_body(model: type[BaseModel]) -> dict[str, Any]:
    """The ``requestBody`` of a route that reads ``model`` itself (``api.bodies.read_body``)."""
    _BODIES[model.__name__] = model
    schema = {"$ref": _SCHEMAS + model.__name__}
    return {"required": True, "content": {"application/json": {"schema": schema}}}


def document(app: FastAPI) -> dict[str, Any]:
    doc = get_openapi(
        title=app.title,
        version=app.version,
        description=app.description,
        routes=app.routes,
    )
    components = doc.setdefault("components", {})
    schemas = components.setdefault("schemas", {})
    schemas.pop("HTTPValidationError", None)
    schemas.pop("ValidationError", None)
    problem = Problem.model_json_schema(ref_template=_SCHEMAS + "{model}", mode="serialization")
    schemas.update(problem.pop("$defs", {}))
    schemas["Problem"] = problem
    for name, model in _BODIES.items():
        body = model.model_json_schema(ref_template=_SCHEMAS + "{model}")
        schemas.update(body.pop("$defs", {}))
        schemas[name] = body
    components["securitySchemes"] = {
        BEARER: {
            "type": "http",
            "scheme": "bearer",
            "description": "An account's API token (conduit admin create-account).",
        }
    }
    for path in doc["paths"].values():
        for op in path.values():
            _drop_fastapi_422(op["responses"])
            _events_not_string(op["responses"])
            if {BEARER: []} in op.get("security", []):
                # Any bearer token may meet its address's budget of failures (``api.auth``).
                op["responses"].setdefault("429", problems(429)[429])
    return doc


def _drop_fastapi_422(responses: dict[str, Any]) -> None:
    """FastAPI documents a 422 with its own validation body on every route with parameters."""
    content = responses.get("422", {}).get("content", {})
    if "application/json" in content:
        del responses["422"]


def _events_not_string(responses: dict[str, Any]) -> None:
    """FastAPI gives a non-JSON response ``schema: string``; an event stream has ``itemSchema``
    for each event instead, and a ``schema`` beside it would describe the whole stream."""
    for response in responses.values():
        stream = response.get("content", {}).get("text/event-stream", {})
        if "itemSchema" in stream:
            stream.pop("schema", None)


def install(app: FastAPI) -> None:
    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = document(app)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
