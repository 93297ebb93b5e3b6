"""``GET /v1/fleet``: every runner the fleet registry knows (``tracker.fleet``), for operators.

Only admin accounts (``accounts.is_admin``) see it; to anyone else the route does not exist
(404, as a private model). Read from Redis on each call: an operator's view, not a hot path.
"""

from __future__ import annotations

import time

from fastapi import APIRouter
from pydantic import BaseModel, Field

from api.deps import AccountDep, ResourcesDep
from api.errors import NotFound
from api.openapi import operation, problems
from api.responses import FastJSONResponse
from tracker.fleet import FleetEntry, RunnerState, read_fleet

router = APIRouter(prefix="/v1", default_response_class=FastJSONResponse)


class FleetRunner(BaseModel):
    id: str = Field(description="The runner's entry id (stable per runner URL).")
    url: str = Field(description="Base URL by which api replicas reach the runner.")
    deployment: str = Field(description="The deployment served, owner/name.")
    version_id: str
    concurrency: int = Field(description="Requests the runner takes at once.")
    state: RunnerState
    hardware: str
    kind: str = Field(description='"cog" (stock Cog) or the runner\'s own type.')
    runner_id: str | None = Field(description="The id the runner gives itself, if any.")
    director: str = Field(description="The director driving the runner.")
    heartbeat_at: float = Field(description="Epoch seconds of the latest heartbeat.")
    heartbeat_age: float = Field(description="Seconds since then, by the api's clock.")


class Fleet(BaseModel):
    runners: list[FleetRunner]


def render_runner(entry: FleetEntry, now: float) -> dict[str, object]:
    return {
        "id": entry.id,
        "url": entry.url,
        "deployment": entry.deployment,
        "version_id": entry.version_id,
        "concurrency": entry.concurrency,
        "state": entry.state.value,
        "hardware": entry.hardware,
        "kind": entry.kind,
        "runner_id": entry.runner_id,
        "director": entry.director,
        "heartbeat_at": entry.heartbeat_at,
        "heartbeat_age": round(entry.age(now), 3),
    }


@router.get(
    "/fleet",
    response_model=Fleet,
    responses=problems(401, 404, 503),
    openapi_extra=operation(),
    summary="The runners of the fleet (admin accounts only)",
)
async def get_fleet(account: AccountDep, resources: ResourcesDep) -> FastJSONResponse:
    if not account.is_admin:
        raise NotFound("Not Found")
    entries = await read_fleet(resources.redis)
    now = time.time()
    ordered = sorted(entries.values(), key=lambda e: (e.deployment, e.url))
    return FastJSONResponse({"runners": [render_runner(e, now) for e in ordered]})
