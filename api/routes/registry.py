"""The registry of inference servers, at the seed's own paths: ``POST /inference_server``
registers one, ``GET|PUT|DELETE /inference_server/{id}`` reads, updates (a MongoDB update
document) and deletes it, ``POST /inference_servers`` finds them by a MongoDB filter
(:mod:`blocks.inference_servers`). ``POST /inference_server/{id}/heartbeat`` keeps a server
``alive`` for the grace it names; without the next beat it is marked ``dead`` and no longer
routed to.

Any account reads the registry; only an admin account writes it (403 otherwise). A filter or
update the registry cannot apply is a 400 naming where it is (``filter.inference_server_tags.$x``).
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Body, Query, Request, Response
from pydantic import BaseModel, ConfigDict, Field

from api.deps import AccountDep, ResourcesDep
from api.errors import Forbidden, InvalidInput, InvalidRequest, NotFound
from api.openapi import operation, problems
from api.responses import FastJSONResponse
from blocks import inference_servers
from blocks.mongo.common import MongoError
from blocks.mongo.updates import parse_update
from catalog.records import AccountInfo
from core.nesting import TooDeep, check_depth

router = APIRouter(default_response_class=FastJSONResponse)

ADMINS_ONLY = {
    **problems(403)[403],
    "description": "Only an admin account registers, updates or deletes inference servers.",
}


class InferenceServerCreate(BaseModel):
    """Body of ``POST /inference_server``: the record's fields a client writes."""

    model_config = ConfigDict(extra="forbid")

    inference_server_name: str = Field("", max_length=1000)
    inference_server_metadata: dict[str, Any] = Field(
        default_factory=dict, description="Free JSON: region, provider, quota data…"
    )
    inference_server_tags: list[str] = Field(default_factory=list)
    inference_server_public_url: str = Field("", max_length=2000)


class InferenceServer(BaseModel):
    inference_server_id: str
    inference_server_name: str
    inference_server_metadata: dict[str, Any]
    inference_server_tags: list[str]
    inference_server_public_url: str
    registered_at: datetime
    updated_at: datetime
    heartbeat_at: datetime | None = Field(None, description="The last heartbeat.")
    status: str = Field(
        description="registered (never heartbeat), alive, or dead (its grace ran out)."
    )


class Heartbeat(BaseModel):
    """Body of ``POST /inference_server/{id}/heartbeat``."""

    model_config = ConfigDict(extra="forbid")

    grace: float = Field(
        15.0,
        ge=0,
        le=86400,
        description="Seconds the server stays alive without the next beat (0: dead now).",
    )


class InferenceServerList(BaseModel):
    results: list[InferenceServer]


def _require_admin(account: AccountInfo) -> None:
    if not account.is_admin:
        raise Forbidden("Only an admin account may change the inference server registry")


def _refused(error: MongoError) -> InvalidRequest:
    return InvalidRequest(
        f"{error.location}: {error.message}",
        errors=[{"field": error.location, "message": error.message}],
    )


def _storable(doc: dict[str, Any]) -> dict[str, Any]:
    """The record, if JSON that Postgres can store (no NUL, integers within 64 bits)."""
    try:
        check_depth(doc, "body")
    except TooDeep as error:
        raise InvalidInput(
            f"{error.field}: {error.message}",
            errors=[{"field": error.field, "message": error.message}],
        ) from None
    try:
        encoded = orjson.dumps(doc)
    except orjson.JSONEncodeError as error:
        raise InvalidInput(f"cannot be stored: {error}") from None
    if b"\\u0000" in encoded:
        raise InvalidInput("the record must not contain NUL (\\u0000) characters")
    return doc


def _location(server_id: str, request: Request, resources: ResourcesDep) -> str:
    return f"{resources.base_url(request)}/inference_server/{server_id}"


@router.post(
    "/inference_server",
    status_code=201,
    response_model=InferenceServer,
    responses={**problems(400, 401, 413, 422, 503), 403: ADMINS_ONLY},
    openapi_extra=operation(),
)
async def register_inference_server(
    request: Request, body: InferenceServerCreate, account: AccountDep, resources: ResourcesDep
) -> FastJSONResponse:
    """Register an inference server; the server draws its ``inference_server_id``."""
    _require_admin(account)
    record = await inference_servers.create(resources.engine, _storable(body.model_dump()))
    return FastJSONResponse(
        inference_servers.render(record),
        status_code=201,
        headers={"Location": _location(record.id, request, resources)},
    )


@router.get(
    "/inference_server/{server_id}",
    response_model=InferenceServer,
    responses=problems(401, 404, 503),
    openapi_extra=operation(),
)
async def get_inference_server(
    server_id: str, account: AccountDep, resources: ResourcesDep
) -> FastJSONResponse:
    record = await inference_servers.get(resources.engine, server_id)
    if record is None:
        raise NotFound(f"Inference server {server_id} not found")
    return FastJSONResponse(inference_servers.render(record))


@router.put(
    "/inference_server/{server_id}",
    response_model=InferenceServer,
    responses={**problems(400, 401, 404, 413, 422, 503), 403: ADMINS_ONLY},
    openapi_extra=operation(),
)
async def update_inference_server(
    server_id: str,
    update: Annotated[Any, Body(description="A MongoDB update document ($set, $push, …).")],
    account: AccountDep,
    resources: ResourcesDep,
) -> FastJSONResponse:
    """Update a server with a MongoDB update document, applied by Postgres in one statement."""
    _require_admin(account)
    try:
        record = await inference_servers.update(resources.engine, server_id, parse_update(update))
    except MongoError as error:
        raise _refused(error) from None
    if record is None:
        raise NotFound(f"Inference server {server_id} not found")
    return FastJSONResponse(inference_servers.render(record))


@router.delete(
    "/inference_server/{server_id}",
    status_code=204,
    responses={**problems(401, 404, 503), 403: ADMINS_ONLY},
    openapi_extra=operation(),
)
async def delete_inference_server(
    server_id: str, account: AccountDep, resources: ResourcesDep
) -> Response:
    _require_admin(account)
    if await inference_servers.delete(resources.engine, server_id):
        return Response(status_code=204)
    raise NotFound(f"Inference server {server_id} not found")


@router.post(
    "/inference_server/{server_id}/heartbeat",
    response_model=InferenceServer,
    responses={**problems(400, 401, 404, 413, 422, 503), 403: ADMINS_ONLY},
    openapi_extra=operation(),
)
async def heartbeat_inference_server(
    server_id: str,
    account: AccountDep,
    resources: ResourcesDep,
    body: Heartbeat | None = None,
) -> FastJSONResponse:
    """The server is alive for ``grace`` seconds from now."""
    _require_admin(account)
    record = await inference_servers.heartbeat(
        resources.engine, server_id, (body or Heartbeat()).grace
    )
    if record is None:
        raise NotFound(f"Inference server {server_id} not found")
    return FastJSONResponse(inference_servers.render(record))


@router.post(
    "/inference_servers",
    response_model=InferenceServerList,
    responses=problems(400, 401, 413, 422, 503),
    openapi_extra=operation(),
)
async def query_inference_servers(
    account: AccountDep,
    resources: ResourcesDep,
    document: Annotated[Any, Body(description="A MongoDB filter; {} matches every server.")],
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> FastJSONResponse:
    """The servers a MongoDB filter matches, oldest registration first."""
    try:
        found = await inference_servers.query(resources.engine, document, limit)
    except MongoError as error:
        raise _refused(error) from None
    return FastJSONResponse({"results": [inference_servers.render(record) for record in found]})
