"""``GET /v1/hardware``: the hardware classes the fleet has now, in Replicate's shape.

A class is what runners say they run on (``cpu`` or ``gpu``, from their capability documents,
kept in the fleet registry: ``tracker.fleet``); only classes with a runner registered and
heartbeating are listed, so the answer says what a deployment can run on today. A runner that
does not say (a stock Cog server, the echo runner) adds no class. Read from
Redis on each call (the registry's index and one ``MGET``).
"""

from __future__ import annotations

import logging

from fastapi import APIRouter
from pydantic import BaseModel, Field, RootModel
from redis.asyncio import Redis
from redis.exceptions import RedisError

from api.deps import AccountDep, ResourcesDep
from api.openapi import operation, problems
from api.responses import FastJSONResponse
from protocol.capabilities import UNKNOWN_HARDWARE
from tracker.fleet import read_fleet

log = logging.getLogger(__name__)
router = APIRouter(prefix="/v1", default_response_class=FastJSONResponse)

#: What each class is called for people; a class the table does not know shows its sku.
NAMES = {"cpu": "CPU", "gpu": "GPU"}
#: Said of runners that did not tell (stock Cog): no class of its own.
UNKNOWN = frozenset({UNKNOWN_HARDWARE, "unknown"})


class Hardware(BaseModel):
    name: str = Field(description="The class's name for people.")
    sku: str = Field(description="What deployments name it by (`hardware`).")


class HardwareList(RootModel[list[Hardware]]):
    pass


def hardware_classes(skus: set[str]) -> list[dict[str, str]]:
    """Each known sku once, in a stable order, as Replicate lists hardware."""
    return [{"name": NAMES.get(sku, sku), "sku": sku} for sku in sorted(skus - UNKNOWN)]


async def fleet_classes(redis: Redis) -> set[str]:
    """The classes the fleet has now (raises what Redis raises)."""
    entries = await read_fleet(redis)
    return {entry.hardware for entry in entries.values()} - UNKNOWN


async def served_on(redis: Redis) -> dict[str, str]:
    """Each deployment's class as its registered runners say (``owner/name`` -> sku), for a
    deployment that names none; empty when Redis cannot tell (a read of the catalogue must
    not fail on it)."""
    try:
        entries = await read_fleet(redis)
    except RedisError as error:
        log.warning("the fleet registry could not be read: %s", error)
        return {}
    found: dict[str, str] = {}
    for entry in sorted(entries.values(), key=lambda e: e.id):
        if entry.hardware not in UNKNOWN:
            found.setdefault(entry.deployment, entry.hardware)
    return found


@router.get(
    "/hardware",
    response_model=HardwareList,
    responses=problems(401, 503),
    openapi_extra=operation(),
    summary="The hardware classes the fleet runs on now",
)
async def list_hardware(account: AccountDep, resources: ResourcesDep) -> FastJSONResponse:
    return FastJSONResponse(hardware_classes(await fleet_classes(resources.redis)))
