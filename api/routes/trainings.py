"""Trainings, as Replicate's API has them: create on a model version, get, list, cancel.

A training is a prediction row of kind ``training`` on the trained version's training streams
(``tp-<version id>``, ``tracker.keys.Target.training``): queued, fenced, retried, streamed and
delivered to webhooks exactly as a prediction is, and run by directors started with
``--job-kind training`` beside a Cog trainer (``cog.server.http --x-mode train``), which call
its ``/trainings`` endpoint. Its input is checked against the version's ``TrainingInput``
before anything is stored. On success ``output`` holds ``version`` (the destination model's new
version: the base model's schema with the trained weights) and ``weights`` (their URL, kept in
the file store); see ``director.trainings``.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from pydantic import Field

from api import serving
from api.deps import AccountDep, Resources, ResourcesDep, limit_creates
from api.errors import Forbidden, InvalidInput, NotFound
from api.openapi import operation, problems
from api.prediction_filters import parse_filters
from api.protocol import PredictionCreate
from api.responses import FastJSONResponse
from api.routes.models import visible_model
from api.schemas import Training, TrainingPage
from catalog import records
from catalog.records import AccountInfo, VersionInfo
from front.destinations import MODEL_NAME, Destination
from tracker.input_checks import build_validator
from tracker.keys import Target
from tracker.render import render_training

router = APIRouter(prefix="/v1", default_response_class=FastJSONResponse)

#: Replicate's own words for a destination that is not there (or not the caller's to see).
NO_DESTINATION = "The specified training destination does not exist"


class TrainingCreate(PredictionCreate):
    destination: str = Field(max_length=201, description="owner/name of the model trained into.")
    input: dict[str, Any] = Field(default_factory=dict)


def training_validator(version: VersionInfo) -> Any:
    """The version's ``TrainingInput`` validator (the schema read as ``Input`` is), or a 422
    when the version has none: its runner does not train."""
    schemas = version.openapi_schema.get("components", {}).get("schemas", {})
    training = schemas.get("TrainingInput")
    if training is None:
        message = f"version {version.id} of {version.model} cannot be trained: no TrainingInput"
        raise InvalidInput(message, errors=[{"field": "version", "message": message}])
    as_input = {"components": {"schemas": {**schemas, "Input": training}}}
    return build_validator(as_input)


async def _destination(resources: Resources, account: AccountInfo, name: str) -> str:
    found = MODEL_NAME.fullmatch(name)
    if found is None:
        raise InvalidInput(
            "destination: must be owner/name",
            errors=[{"field": "destination", "message": "must be owner/name"}],
        )
    model = await resources.catalog.model(account, found["owner"], found["name"])
    if model is None:
        raise NotFound(NO_DESTINATION)
    if not records.manages(account, model.owner):
        raise Forbidden(f"Only {model.owner} may train into {name}")
    return f"{model.owner}/{model.name}"


@router.post(
    "/models/{owner}/{name}/versions/{version_id}/trainings",
    status_code=201,
    response_model=Training,
    responses=problems(400, 401, 403, 404, 413, 422, 429, 503),
    openapi_extra=operation(),
    dependencies=[Depends(limit_creates)],
    summary="Train a model version; the destination model gets the trained version",
)
async def create_training(
    owner: str,
    name: str,
    version_id: str,
    body: TrainingCreate,
    request: Request,
    account: AccountDep,
    resources: ResourcesDep,
) -> FastJSONResponse:
    model = await visible_model(resources, account, owner, name)
    found = await resources.catalog.version_of(model, version_id)
    if found is None:
        raise NotFound(f"Version {version_id} of {owner}/{name} does not exist")
    version = found[0]
    destination = Destination(
        version,
        training_validator(version),
        Target.training(version.id, version.shards),
        trains_into=await _destination(resources, account, body.destination),
    )
    row, _ = await serving.create(resources, account, destination, body)
    return FastJSONResponse(render_training(row, resources.links(request)), 201)


@router.get(
    "/trainings",
    response_model=TrainingPage,
    responses=problems(400, 401, 503),
    openapi_extra=operation(),
)
async def list_trainings(
    request: Request,
    account: AccountDep,
    resources: ResourcesDep,
    cursor: str | None = None,
    created_after: Annotated[str | None, Query()] = None,
    created_before: Annotated[str | None, Query()] = None,
) -> FastJSONResponse:
    """The account's trainings, newest first, 100 a page."""
    filters = parse_filters({"created_after": created_after, "created_before": created_before})
    links = resources.links(request)
    page = await serving.list_page(resources, account, links, cursor, filters, kind="training")
    return FastJSONResponse(page)


#: How a route on one training declares itself.
_ONE: dict[str, Any] = {
    "response_model": Training,
    "responses": problems(400, 401, 404, 503),
    "openapi_extra": operation(),
}


@router.get("/trainings/{training_id}", **_ONE)
async def get_training(
    request: Request, training_id: str, account: AccountDep, resources: ResourcesDep
) -> FastJSONResponse:
    row = await serving.get(resources, account, training_id, replica=True, kind="training")
    return FastJSONResponse(render_training(row, resources.links(request)))


@router.post("/trainings/{training_id}/cancel", **_ONE)
async def cancel_training(
    request: Request, training_id: str, account: AccountDep, resources: ResourcesDep
) -> FastJSONResponse:
    links = resources.links(request)
    row = await serving.cancel(resources, account, training_id, links, kind="training")
    return FastJSONResponse(render_training(row, links))
