"""Models, versions and deployments, read-only over the API (created with ``conduit admin``).

An account sees public ones, its own and those granted to it; any other is answered exactly
as a name that does not exist (404, same detail), in lists too.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from fastapi import APIRouter, Request

from api import serving
from api.deps import AccountDep, Resources, ResourcesDep
from api.errors import InvalidRequest, NotFound
from api.openapi import operation, problems
from api.responses import FastJSONResponse
from api.routes import hardware
from api.routes.account import render_account
from api.schemas import Deployment, DeploymentPage, Model, ModelPage, Version, VersionPage
from catalog import lookups
from catalog.records import AccountInfo, DeploymentInfo, ModelInfo, VersionInfo
from tracker.keyset import PageKey
from tracker.render import iso

router = APIRouter(prefix="/v1", default_response_class=FastJSONResponse)
#: Every route here: bearer auth, and these problems (see ``api.openapi``).
_READ: dict[str, Any] = {"responses": problems(400, 401, 404, 503), "openapi_extra": operation()}


def render_version(version: VersionInfo) -> dict[str, Any]:
    return {
        "id": version.id,
        "created_at": iso(version.created_at),
        "cog_version": version.cog_version or "",
        "openapi_schema": version.openapi_schema,
    }


def render_model(model: ModelInfo, latest: VersionInfo | None, base_url: str) -> dict[str, Any]:
    return {
        "url": f"{base_url}/v1/models/{model.owner}/{model.name}",
        "owner": model.owner,
        "name": model.name,
        "description": model.description,
        "visibility": model.visibility,
        "hardware": model.hardware,
        "github_url": model.github_url,
        "paper_url": model.paper_url,
        "license_url": model.license_url,
        "run_count": 0,
        "cover_image_url": model.cover_image_url,
        "default_example": None,
        "latest_version": render_version(latest) if latest is not None else None,
    }


#: A deployment's hardware when it names none and no runner of it says.
UNKNOWN_HARDWARE = "unknown"


def render_deployment(deployment: DeploymentInfo, served_on: dict[str, str]) -> dict[str, Any]:
    """Replicate's shape, every field true: ``hardware`` is the class it names, else (a
    deployment made before they named one) what its registered runners say they run on
    (``served_on``), else ``unknown``; the instance bounds are those the Kubernetes kit
    scales its directors within (``conduit admin scaler``). ``withdrawn``, not Replicate's: why
    it takes no predictions when its model's owner took the model back (else null)."""
    hardware = deployment.hardware or served_on.get(deployment.full_name, UNKNOWN_HARDWARE)
    released_by = deployment.released_by
    return {
        "owner": deployment.owner,
        "name": deployment.name,
        "current_release": {
            "number": deployment.release_number,
            "model": deployment.model,
            "version": deployment.version_id,
            "created_at": iso(deployment.released_at or deployment.created_at),
            "created_by": render_account(released_by) if released_by is not None else None,
            "configuration": {
                "hardware": hardware,
                "min_instances": deployment.min_instances,
                "max_instances": deployment.max_instances,
                "shards": deployment.shards,
                "prediction_timeout": deployment.prediction_timeout,
            },
        },
        "withdrawn": deployment.withdrawal,
    }


async def rendered_deployments(
    resources: Resources, deployments: Sequence[DeploymentInfo]
) -> list[dict[str, Any]]:
    """Each rendered; the fleet is read (once) only when one of them names no hardware."""
    served_on = {}
    if any(deployment.hardware is None for deployment in deployments):
        served_on = await hardware.served_on(resources.redis)
    return [render_deployment(deployment, served_on) for deployment in deployments]


async def visible_deployment(
    resources: Resources, account: AccountInfo, owner: str, name: str
) -> DeploymentInfo:
    deployment = await resources.catalog.deployment(account, owner, name)
    if deployment is None:  # or one the account may not see: the same answer
        raise NotFound(f"Deployment {owner}/{name} does not exist")
    return deployment


async def visible_model(
    resources: Resources, account: AccountInfo, owner: str, name: str
) -> ModelInfo:
    model = await resources.catalog.model(account, owner, name)
    if model is None:  # or one the account may not see: the same answer
        raise NotFound(f"Model {owner}/{name} does not exist")
    return model


async def _version(
    resources: Resources, account: AccountInfo, model: ModelInfo, version_id: str
) -> VersionInfo:
    found = await resources.catalog.version(account, version_id)
    if found is None or found[0].model != f"{model.owner}/{model.name}":
        raise NotFound(f"Version {version_id} of {model.owner}/{model.name} does not exist")
    return found[0]


async def latest_version(resources: Resources, model: ModelInfo) -> VersionInfo | None:
    if model.latest_version_id is None:
        return None
    found = await resources.catalog.version_of(model, model.latest_version_id)
    return found[0] if found is not None else None


def _position(key: PageKey) -> lookups.Position:
    try:
        return lookups.Position(key.created_at, int(key.id))
    except ValueError as error:
        raise InvalidRequest("The cursor is not valid.") from error


def _key(item: ModelInfo | DeploymentInfo) -> PageKey:
    return PageKey(item.created_at, str(item.id))


_Listed = TypeVar("_Listed", ModelInfo, DeploymentInfo)


async def _page(
    resources: Resources,
    account: AccountInfo,
    cursor: str | None,
    url: str,
    read: Callable[..., Awaitable[list[_Listed]]],
) -> tuple[Sequence[_Listed], str | None, str | None]:
    """One page of a newest-first list (``read``: ``lookups.list_models`` or
    ``list_deployments``) and its next and previous URLs (``url``, a cursor appended)."""
    limit = resources.settings.page_size
    after, before = serving.read_cursor(cursor)
    rows = await read(
        resources.engine,
        account,
        after=_position(after) if after else None,
        before=_position(before) if before else None,
        limit=limit + 1,
    )
    return serving.keyset_page(rows, after, before, limit, f"{url}?cursor=", _key)


@router.get(
    "/models",
    response_model=ModelPage,
    responses=problems(400, 401, 503),
    openapi_extra=operation(),
)
async def list_models(
    request: Request, account: AccountDep, resources: ResourcesDep, cursor: str | None = None
) -> FastJSONResponse:
    """The models this account may see (public ones, its own, those granted), newest first."""
    base = resources.base_url(request)
    page, next_url, previous_url = await _page(
        resources, account, cursor, f"{base}/v1/models", lookups.list_models
    )
    results = [render_model(model, await latest_version(resources, model), base) for model in page]
    return FastJSONResponse({"next": next_url, "previous": previous_url, "results": results})


@router.get("/models/{owner}/{name}", response_model=Model, **_READ)
async def get_model(
    request: Request, owner: str, name: str, account: AccountDep, resources: ResourcesDep
) -> FastJSONResponse:
    model = await visible_model(resources, account, owner, name)
    latest = await latest_version(resources, model)
    return FastJSONResponse(render_model(model, latest, resources.base_url(request)))


@router.get("/models/{owner}/{name}/versions", response_model=VersionPage, **_READ)
async def list_model_versions(
    owner: str, name: str, account: AccountDep, resources: ResourcesDep
) -> FastJSONResponse:
    model = await visible_model(resources, account, owner, name)
    ids = await lookups.list_versions(resources.engine, model.id)
    results = [render_version(await _version(resources, account, model, v)) for v in ids]
    return FastJSONResponse({"next": None, "previous": None, "results": results})


@router.get("/models/{owner}/{name}/versions/{version_id}", response_model=Version, **_READ)
async def get_model_version(
    owner: str, name: str, version_id: str, account: AccountDep, resources: ResourcesDep
) -> FastJSONResponse:
    model = await visible_model(resources, account, owner, name)
    return FastJSONResponse(render_version(await _version(resources, account, model, version_id)))


@router.get(
    "/deployments",
    response_model=DeploymentPage,
    responses=problems(400, 401, 503),
    openapi_extra=operation(),
)
async def list_deployments(
    request: Request, account: AccountDep, resources: ResourcesDep, cursor: str | None = None
) -> FastJSONResponse:
    """The deployments this account may use (public ones, its own, those granted), newest
    first."""
    base = resources.base_url(request)
    page, next_url, previous_url = await _page(
        resources, account, cursor, f"{base}/v1/deployments", lookups.list_deployments
    )
    results = await rendered_deployments(resources, page)
    return FastJSONResponse({"next": next_url, "previous": previous_url, "results": results})


@router.get("/deployments/{owner}/{name}", response_model=Deployment, **_READ)
async def get_deployment(
    owner: str, name: str, account: AccountDep, resources: ResourcesDep
) -> FastJSONResponse:
    deployment = await visible_deployment(resources, account, owner, name)
    [rendered] = await rendered_deployments(resources, [deployment])
    return FastJSONResponse(rendered)
