"""A JSON request body read into its model by the route itself, refused as FastAPI refuses a
declared body (JSON first, then the model in Python mode; the same problem bodies).

The hot routes (the creates and ``/run``) read their body here rather than declaring it:
FastAPI's dependency solving and body handling were a measurable part of their time. Their
OpenAPI document still names the model (``api.openapi.request_body``).
"""

from __future__ import annotations

import json
from typing import Any, TypeVar

import orjson
from fastapi import HTTPException, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError

from api.error_handlers import undecodable_body

Body = TypeVar("Body", bound=BaseModel)


async def read_body(request: Request, model: type[Body]) -> Body:
    try:
        raw = await request.body()
        if not raw:
            missing = {"type": "missing", "loc": ("body",), "msg": "Field required", "input": None}
            raise RequestValidationError([missing])
        data: Any = raw  # not JSON by its Content-Type: validated as the bytes it is
        if _is_json(request.headers.get("content-type")):
            try:
                data = orjson.loads(raw)
            except orjson.JSONDecodeError:
                data = _json_or_problem(raw)  # what orjson refuses (NaN, big ints) json may take
    except RequestValidationError:
        raise
    except Exception as error:
        # FastAPI's answer to a body it could not read: nested past what a parser recurses
        # into, or cut off (the size limit ends the body it refuses, ``api.limits``).
        raise HTTPException(400, "There was an error parsing the body") from error
    try:
        return model.model_validate(data)
    except ValidationError as error:
        raise RequestValidationError(
            [{**e, "loc": ("body", *e["loc"])} for e in error.errors()]
        ) from None


def _is_json(content_type: str | None) -> bool:
    """``application/json`` or ``application/*+json``, parameters aside, as FastAPI reads a
    declared body (its strict content type: no Content-Type is no JSON)."""
    media = (content_type or "").split(";", 1)[0].strip().lower()
    return media == "application/json" or (
        media.startswith("application/") and media.endswith("+json")
    )


def _json_or_problem(raw: bytes) -> Any:
    """``raw`` as FastAPI's JSON reading takes it, or its 422."""
    try:
        return json.loads(raw)
    except json.JSONDecodeError as error:
        invalid = {
            "type": "json_invalid",
            "loc": ("body", error.pos),
            "msg": "JSON decode error",
            "input": {},
            "ctx": {"error": error.msg},
        }
        raise RequestValidationError([invalid]) from None
    except UnicodeDecodeError as error:
        raise undecodable_body(error) from None
