"""``GET /v1/hardware``: the hardware classes the fleet has now, in Replicate's shape.

A class is what runners say they run on (``cpu`` or ``gpu``, from their capability documents,
kept in the fleet registry: ``tracker.fleet``); only classes with a runner registered and
heartbeating are listed, so the answer says what a deployment can run on today. A runner that
does not say (a stock Cog server, the echo runner) adds no class. Read from
Redis on each call (the registry's index and one ``MGET``).
"""

from __future__ import annotations

from fastapi import APIRouter
from pydantic import BaseModel, Field, RootModel

from api.deps import AccountDep, ResourcesDep
from api.openapi import operation, problems
from api.responses import FastJSONResponse
from protocol.capabilities import UNKNOWN_HARDWARE
from tracker.fleet import read_fleet

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


@router.get(
    "/hardware",
    response_model=HardwareList,
    responses=problems(401, 503),
    openapi_extra=operation(),
    summary="The hardware classes the fleet runs on now",
)
async def list_hardware(account: AccountDep, resources: ResourcesDep) -> FastJSONResponse:
    entries = await read_fleet(resources.redis)
    return FastJSONResponse(hardware_classes({entry.hardware for entry in entries.values()}))
