"""Models, versions and deployments, read-only over the API (created with ``conduit admin``)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from api.deps import AccountDep, Resources, ResourcesDep
from api.errors import NotFound
from api.openapi import operation, problems
from api.responses import FastJSONResponse
from api.schemas import Deployment, Model, Version, VersionPage
from tracker import catalog
from tracker.catalog import DeploymentInfo, ModelInfo, VersionInfo
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
        "github_url": None,
        "paper_url": None,
        "license_url": None,
        "run_count": 0,
        "cover_image_url": None,
        "default_example": None,
        "latest_version": render_version(latest) if latest is not None else None,
    }


def render_deployment(deployment: DeploymentInfo) -> dict[str, Any]:
    return {
        "owner": deployment.owner,
        "name": deployment.name,
        "current_release": {
            "number": deployment.release_number,
            "model": deployment.model,
            "version": deployment.version_id,
            "created_at": iso(deployment.created_at),
            "created_by": None,
            "configuration": {
                "hardware": "runner",
                "min_instances": 0,
                "max_instances": 0,
                "shards": deployment.shards,
                "prediction_timeout": deployment.prediction_timeout,
            },
        },
    }


async def _model(resources: Resources, owner: str, name: str) -> ModelInfo:
    model = await resources.catalog.model(owner, name)
    if model is None:
        raise NotFound(f"Model {owner}/{name} does not exist")
    return model


async def _version(resources: Resources, model: ModelInfo, version_id: str) -> VersionInfo:
    found = await resources.catalog.version(version_id)
    if found is None or found[0].model != f"{model.owner}/{model.name}":
        raise NotFound(f"Version {version_id} of {model.owner}/{model.name} does not exist")
    return found[0]


@router.get("/models/{owner}/{name}", response_model=Model, **_READ)
async def get_model(
    request: Request, owner: str, name: str, _: AccountDep, resources: ResourcesDep
) -> FastJSONResponse:
    model = await _model(resources, owner, name)
    latest = None
    if model.latest_version_id is not None:
        latest = await _version(resources, model, model.latest_version_id)
    return FastJSONResponse(render_model(model, latest, resources.base_url(request)))


@router.get("/models/{owner}/{name}/versions", response_model=VersionPage, **_READ)
async def list_model_versions(
    owner: str, name: str, _: AccountDep, resources: ResourcesDep
) -> FastJSONResponse:
    model = await _model(resources, owner, name)
    ids = await catalog.list_versions(resources.engine, model.id)
    results = [render_version(await _version(resources, model, v)) for v in ids]
    return FastJSONResponse({"next": None, "previous": None, "results": results})


@router.get("/models/{owner}/{name}/versions/{version_id}", response_model=Version, **_READ)
async def get_model_version(
    owner: str, name: str, version_id: str, _: AccountDep, resources: ResourcesDep
) -> FastJSONResponse:
    model = await _model(resources, owner, name)
    return FastJSONResponse(render_version(await _version(resources, model, version_id)))


@router.get("/deployments/{owner}/{name}", response_model=Deployment, **_READ)
async def get_deployment(
    owner: str, name: str, _: AccountDep, resources: ResourcesDep
) -> FastJSONResponse:
    deployment = await resources.catalog.deployment(owner, name)
    if deployment is None:
        raise NotFound(f"Deployment {owner}/{name} does not exist")
    return FastJSONResponse(render_deployment(deployment))
