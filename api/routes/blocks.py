"""Blocks: ``POST /v1/blocks`` publishes a deployment (or a model version) as a block that the
inference gateway runs by id; list, get and delete.

The caller publishes what it manages (its own; an admin account anything); the block belongs
to the owner of what it names, whoever published it (``blocks.blocks.create``), and is deleted
by whoever manages that owner's things (its owner, an admin account). An account reads its own
blocks and those it may use, which are those whose deployment (or model) it may use
(``blocks.blocks``); any other answers 404, exactly as a block that does not exist.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import orjson
from fastapi import APIRouter, Request, Response
from pydantic import BaseModel, ConfigDict, Field

from api import serving
from api.deps import AccountDep, Resources, ResourcesDep
from api.errors import Forbidden, InvalidInput, NotFound, Problem
from api.openapi import operation, problems
from api.responses import FastJSONResponse
from blocks import blocks
from blocks.blocks import BlockInfo
from catalog import lookups, records
from catalog.records import AccountInfo
from tracker.keyset import PageKey
from tracker.render import iso

router = APIRouter(prefix="/v1", default_response_class=FastJSONResponse)

VERSION_ID_LENGTH = 64


class BlockCreate(BaseModel):
    """Body of ``POST /v1/blocks``: a ``deployment`` (``owner/name``) or a ``version`` id."""

    model_config = ConfigDict(extra="ignore")

    deployment: str | None = Field(None, max_length=401)
    version: str | None = Field(None, max_length=VERSION_ID_LENGTH)
    metadata: dict[str, Any] | None = Field(
        None, description="Free JSON describing the block, what search filters on."
    )
    synchronous: bool = Field(False, description="Run it on the synchronous lane (/run).")


class BlockUrls(BaseModel):
    get: str


class Block(BaseModel):
    id: str
    owner: str
    deployment: str | None
    version: str | None
    model: str
    metadata: dict[str, Any]
    synchronous: bool
    created_at: datetime
    urls: BlockUrls


class BlockPage(BaseModel):
    next: str | None = Field(description="URL of the next (older) page.")
    previous: str | None = Field(description="URL of the previous (newer) page.")
    results: list[Block]


#: A block, or what it would name, that the caller may see but not change.
NOT_YOURS = {
    **problems(403)[403],
    "description": "The caller may use it but does not own it: only its owner may publish a "
    "deployment or version, or delete a block.",
}


def render_block(block: BlockInfo, base_url: str) -> dict[str, Any]:
    return {
        "id": block.id,
        "owner": block.owner,
        "deployment": block.deployment,
        "version": block.version_id,
        "model": block.model,
        "metadata": block.metadata,
        "synchronous": block.synchronous,
        "created_at": iso(block.created_at),
        "urls": {"get": f"{base_url}/v1/blocks/{block.id}"},
    }


def _field_error(field: str, message: str, kind: type[Problem] = InvalidInput) -> Problem:
    return kind(f"{field}: {message}", errors=[{"field": field, "message": message}])


def _storable(metadata: dict[str, Any] | None) -> dict[str, Any]:
    """The metadata, if JSON that Postgres can store and every response can carry."""
    if metadata is None:
        return {}
    try:
        encoded = orjson.dumps(metadata)
    except orjson.JSONEncodeError as error:  # a lone surrogate, an integer past 64 bits
        raise _field_error("metadata", f"cannot be stored: {error}") from None
    if b"\\u0000" in encoded:  # jsonb cannot hold NUL
        raise _field_error("metadata", "must not contain NUL (\\u0000) characters")
    return metadata


async def _deployment_id(resources: Resources, account: AccountInfo, name: str) -> int:
    """The deployment ``owner/name`` the caller may publish. One it may not see answers as
    one that does not exist; one it may see but does not own is refused (403)."""
    unknown = _field_error("deployment", f"Deployment {name} does not exist")
    owner, sep, short = name.partition("/")
    if not sep or not owner or not short or "/" in short:
        raise _field_error("deployment", "must be owner/name")
    found = await lookups.get_deployment(resources.engine, owner, short)
    if found is None:
        raise unknown
    if records.manages(account, found.owner):
        return found.id
    if await resources.catalog.deployment(account, owner, short) is None:
        raise unknown
    raise _field_error("deployment", "only its owner may publish it", Forbidden)


async def _version_id(resources: Resources, account: AccountInfo, version: str) -> str:
    """A model version the caller may publish, by the same rules (its model's owner)."""
    unknown = _field_error("version", f"Version {version} does not exist")
    found = await lookups.get_version(resources.engine, version)
    if found is None:
        raise unknown
    if records.manages(account, found.model.partition("/")[0]):
        return found.id
    if await resources.catalog.version(account, version) is None:
        raise unknown
    raise _field_error("version", "only its model's owner may publish it", Forbidden)


@router.post(
    "/blocks",
    status_code=201,
    response_model=Block,
    responses={**problems(400, 401, 413, 422, 503), 403: NOT_YOURS},
    openapi_extra=operation(),
)
async def create_block(
    request: Request, body: BlockCreate, account: AccountDep, resources: ResourcesDep
) -> FastJSONResponse:
    """Publish a deployment, or a model version, that the caller owns as a block."""
    if body.deployment is not None and body.version is not None:
        message = "give a deployment or a version, not both"
        raise InvalidInput(
            message,
            errors=[
                {"field": "deployment", "message": message},
                {"field": "version", "message": message},
            ],
        )
    metadata = _storable(body.metadata)
    named: dict[str, Any]
    if body.deployment is not None:
        named = {"deployment_id": await _deployment_id(resources, account, body.deployment)}
    elif body.version is not None:
        named = {"version_id": await _version_id(resources, account, body.version)}
    else:
        raise _field_error("deployment", "a deployment (owner/name) or a version is required")
    block = await blocks.create(
        resources.engine, metadata=metadata, synchronous=body.synchronous, **named
    )
    rendered = render_block(block, resources.base_url(request))
    return FastJSONResponse(
        rendered, status_code=201, headers={"Location": rendered["urls"]["get"]}
    )


@router.get(
    "/blocks",
    response_model=BlockPage,
    responses=problems(400, 401, 503),
    openapi_extra=operation(),
)
async def list_blocks(
    request: Request, account: AccountDep, resources: ResourcesDep, cursor: str | None = None
) -> FastJSONResponse:
    """The caller's blocks and those it may use, newest first, a page at a time."""
    base_url = resources.base_url(request)
    limit = resources.settings.page_size
    after, before = serving.read_cursor(cursor)
    rows = await blocks.list_blocks(
        resources.engine, account, after=after, before=before, limit=limit + 1
    )
    page, next_url, previous_url = serving.keyset_page(
        rows,
        after,
        before,
        limit,
        f"{base_url}/v1/blocks?cursor=",
        lambda block: PageKey(block.created_at, block.id),
    )
    results = [render_block(block, base_url) for block in page]
    return FastJSONResponse({"next": next_url, "previous": previous_url, "results": results})


@router.get(
    "/blocks/{block_id}",
    response_model=Block,
    responses=problems(401, 404, 503),
    openapi_extra=operation(),
)
async def get_block(
    request: Request, block_id: str, account: AccountDep, resources: ResourcesDep
) -> FastJSONResponse:
    block = await blocks.find(resources.engine, account, block_id, resources.catalog.grants)
    if block is None:
        raise NotFound(f"Block {block_id} not found")
    return FastJSONResponse(render_block(block, resources.base_url(request)))


@router.delete(
    "/blocks/{block_id}",
    status_code=204,
    responses={**problems(401, 404, 503), 403: NOT_YOURS},
    openapi_extra=operation(),
)
async def delete_block(block_id: str, account: AccountDep, resources: ResourcesDep) -> Response:
    """Delete one of the caller's blocks (an admin account: anyone's)."""
    block = await blocks.find(resources.engine, account, block_id, resources.catalog.grants)
    if block is None:
        raise NotFound(f"Block {block_id} not found")
    if not records.manages(account, block.owner):
        raise Forbidden(f"Block {block_id} is not yours: only its owner may delete it")
    if await blocks.delete_block(resources.engine, block_id, block.account_id):
        return Response(status_code=204)
    raise NotFound(f"Block {block_id} not found")
