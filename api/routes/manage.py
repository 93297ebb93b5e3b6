"""Creating, changing and deleting models, versions and deployments, as Replicate's API does.

Who may see a thing is settled first, as the reads settle it (``api.routes.models``): one the
caller may not see answers 404 exactly like a name that does not exist. Whether it may change
it, what a value must be and what a delete must wait for, is the catalogue's one write path
(:mod:`catalog.models`, :mod:`catalog.versions`, :mod:`catalog.deployments`), which
``conduit admin`` goes through too: the account is the principal. A ``hardware`` must be a
class the fleet has now (``GET /v1/hardware``). Registering a version stays an operator's act
(``conduit admin create-model --runner-url``): a version is what a runner serves.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, Literal

from fastapi import APIRouter, Request, Response
from pydantic import BaseModel, ConfigDict, Field

from api.deps import AccountDep, Resources, ResourcesDep
from api.errors import Conflict, Forbidden, InvalidInput, NotFound, Problem
from api.openapi import operation, problems
from api.responses import FastJSONResponse
from api.routes import hardware
from api.routes.models import (
    latest_version,
    render_model,
    rendered_deployments,
    visible_deployment,
    visible_model,
)
from api.schemas import Deployment, Model
from catalog import deployments, models, rules, versions
from catalog.records import DeploymentInfo
from front.destinations import MODEL_NAME

router = APIRouter(prefix="/v1", default_response_class=FastJSONResponse)

_URL = Field(default=None, max_length=2048, pattern=r"^https?://\S+$")
_TEXT = Field(default=None, max_length=10_000)


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


class ModelCreate(_Body):
    owner: str = Field(max_length=100)
    name: str = Field(max_length=100)
    visibility: Literal["public", "private"]
    hardware: str = Field(max_length=64)
    description: str | None = _TEXT
    github_url: str | None = _URL
    paper_url: str | None = _URL
    license_url: str | None = _URL
    cover_image_url: str | None = _URL


class ModelUpdate(_Body):
    visibility: Literal["public", "private"] | None = None
    hardware: str | None = Field(default=None, max_length=64)
    description: str | None = _TEXT
    github_url: str | None = _URL
    paper_url: str | None = _URL
    license_url: str | None = _URL
    cover_image_url: str | None = _URL


class DeploymentCreate(_Body):
    name: str = Field(max_length=100)
    model: str = Field(max_length=201, description="owner/name of the model.")
    version: str = Field(pattern=r"^[0-9a-f]{64}$")
    hardware: str = Field(max_length=64)
    min_instances: int = Field(default=0, ge=0, le=rules.MAX_INSTANCES)
    max_instances: int = Field(default=1, ge=1, le=rules.MAX_INSTANCES)


class DeploymentUpdate(_Body):
    version: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")
    hardware: str | None = Field(default=None, max_length=64)
    min_instances: int | None = Field(default=None, ge=0, le=rules.MAX_INSTANCES)
    max_instances: int | None = Field(default=None, ge=1, le=rules.MAX_INSTANCES)


def _problem(error: Exception) -> Problem:
    """What the catalogue's writes raised, as the problem the client gets."""
    if isinstance(error, rules.Refused):
        return InvalidInput(str(error), errors=[{"field": error.field, "message": error.message}])
    if isinstance(error, rules.InUse):
        return Conflict(str(error))
    if isinstance(error, rules.NotOwner):
        return Forbidden(str(error))
    return NotFound(str(error))


_FAILURES = (rules.Refused, rules.InUse, rules.NotOwner, LookupError)
#: A delete's declaration: 204, or these problems.
_DELETE: dict[str, Any] = {
    "status_code": 204,
    "responses": problems(401, 403, 404, 409, 503),
    "openapi_extra": operation(),
}


@contextlib.contextmanager
def _refusals() -> Iterator[None]:
    """What the catalogue's writes refuse, answered as its problem."""
    try:
        yield
    except _FAILURES as error:
        raise _problem(error) from error


def _changes(body: DeploymentCreate | DeploymentUpdate) -> deployments.DeploymentChanges:
    return deployments.DeploymentChanges(
        version=body.version,
        hardware=body.hardware,
        min_instances=body.min_instances,
        max_instances=body.max_instances,
    )


async def _known_hardware(
    resources: Resources, wanted: str | None, current: str | None
) -> set[str]:
    """The fleet's hardware classes, for the catalogue to check a new ``wanted`` against
    (read only when there is one)."""
    if wanted is not None and wanted != current:
        return await hardware.fleet_classes(resources.redis)
    return set()


async def _rendered_deployment(
    resources: Resources, deployment: DeploymentInfo, before: DeploymentInfo | None = None
) -> FastJSONResponse:
    """The deployment as changed here; whether its version (and the one it ran ``before``) is
    deployed changed too: this process forgets them all."""
    await resources.catalog.changed(
        deployment=(deployment.owner, deployment.name), version=deployment.version_id
    )
    if before is not None:
        resources.catalog.forget(version=before.version_id)
    [rendered] = await rendered_deployments(resources, [deployment])
    return FastJSONResponse(rendered)


@router.post(
    "/models",
    status_code=201,
    response_model=Model,
    responses=problems(400, 401, 403, 409, 422, 503),
    openapi_extra=operation(),
    summary="Create a model (its versions are registered by runners)",
)
async def create_model(
    body: ModelCreate, request: Request, account: AccountDep, resources: ResourcesDep
) -> FastJSONResponse:
    with _refusals():
        known = await _known_hardware(resources, body.hardware, None)
        values = body.model_dump(exclude={"owner", "name"}, exclude_none=True)
        model = await models.create_model(
            resources.engine, account, body.owner, body.name, values, known
        )
    await resources.catalog.changed(model=(model.owner, model.name))
    return FastJSONResponse(render_model(model, None, resources.base_url(request)), 201)


@router.patch(
    "/models/{owner}/{name}",
    response_model=Model,
    responses=problems(400, 401, 403, 404, 422, 503),
    openapi_extra=operation(),
)
async def update_model(
    owner: str,
    name: str,
    body: ModelUpdate,
    request: Request,
    account: AccountDep,
    resources: ResourcesDep,
) -> FastJSONResponse:
    model = await visible_model(resources, account, owner, name)
    changes = body.model_dump(include=body.model_fields_set)
    if changes.get("visibility", "") is None:
        raise InvalidInput(
            "visibility: must be public or private",
            errors=[{"field": "visibility", "message": "must be public or private"}],
        )
    with _refusals():
        known = await _known_hardware(resources, changes.get("hardware"), model.hardware)
        model = await models.update_model(resources.engine, model, account, changes, known)
    await resources.catalog.changed(model=(owner, name))
    latest = await latest_version(resources, model)
    return FastJSONResponse(render_model(model, latest, resources.base_url(request)))


@router.delete("/models/{owner}/{name}", **_DELETE)
async def delete_model(
    owner: str, name: str, account: AccountDep, resources: ResourcesDep
) -> Response:
    model = await visible_model(resources, account, owner, name)
    with _refusals():
        await models.delete_model(resources.engine, model, account)
    await resources.catalog.changed(model=(owner, name))
    return Response(status_code=204)


@router.delete("/models/{owner}/{name}/versions/{version_id}", **_DELETE)
async def delete_version(
    owner: str, name: str, version_id: str, account: AccountDep, resources: ResourcesDep
) -> Response:
    model = await visible_model(resources, account, owner, name)
    found = await resources.catalog.version_of(model, version_id)
    if found is None:
        raise NotFound(f"Version {version_id} of {owner}/{name} does not exist")
    with _refusals():
        await versions.delete_version(resources.engine, model, version_id, account)
    await resources.catalog.changed(model=(owner, name), version=version_id)
    return Response(status_code=204)


@router.post(
    "/deployments",
    status_code=201,
    response_model=Deployment,
    responses=problems(400, 401, 404, 409, 422, 503),
    openapi_extra=operation(),
    summary="Create a deployment of a model version, owned by the caller",
)
async def create_deployment(
    body: DeploymentCreate, account: AccountDep, resources: ResourcesDep
) -> FastJSONResponse:
    found = MODEL_NAME.fullmatch(body.model)
    if found is None:
        raise InvalidInput(
            "model: must be owner/name",
            errors=[{"field": "model", "message": "must be owner/name"}],
        )
    model = await resources.catalog.model(account, found["owner"], found["name"])
    if model is None:  # or one the account may not see
        message = f"model {body.model} does not exist"
        raise InvalidInput(message, errors=[{"field": "model", "message": message}])
    changes = _changes(body)
    with _refusals():
        known = await _known_hardware(resources, body.hardware, None)
        deployment = await deployments.create_deployment(
            resources.engine, account, account.name, body.name, model, changes, known_hardware=known
        )
    answer = await _rendered_deployment(resources, deployment)
    answer.status_code = 201
    return answer


@router.patch(
    "/deployments/{owner}/{name}",
    response_model=Deployment,
    responses=problems(400, 401, 403, 404, 422, 503),
    openapi_extra=operation(),
    summary="Release a new version or configuration of a deployment",
)
async def update_deployment(
    owner: str, name: str, body: DeploymentUpdate, account: AccountDep, resources: ResourcesDep
) -> FastJSONResponse:
    deployment = await visible_deployment(resources, account, owner, name)
    changes = _changes(body)
    with _refusals():
        known = await _known_hardware(resources, body.hardware, deployment.hardware)
        updated = await deployments.update_deployment(
            resources.engine, deployment, account, changes, known_hardware=known
        )
    return await _rendered_deployment(resources, updated, deployment)


@router.delete("/deployments/{owner}/{name}", **_DELETE)
async def delete_deployment(
    owner: str, name: str, account: AccountDep, resources: ResourcesDep
) -> Response:
    deployment = await visible_deployment(resources, account, owner, name)
    with _refusals():
        await deployments.delete_deployment(resources.engine, deployment, account)
    await resources.catalog.changed(deployment=(owner, name), version=deployment.version_id)
    return Response(status_code=204)
