"""A destination handed to the synchronous lane (``/run``, and a gateway's synchronous block):
which lane it runs on and what it is recorded under."""

from __future__ import annotations

from front.destinations import Destination
from lane.request import Placement
from lane.service import Lane


def lane_name(lane: Lane, destination: Destination) -> str:
    """A deployment's own lane; a version's, the lane the supply runs it on (else one of its
    own, ``version:<id>``)."""
    if destination.deployment is not None:
        return destination.deployment
    version = destination.version.id
    return lane.supply.lane_for_version(version) or f"version:{version}"


def placement(lane: Lane, destination: Destination) -> Placement:
    """Where the lane runs ``destination``, and what the run is recorded under."""
    version = destination.version
    return Placement(
        lane=lane_name(lane, destination),
        model=version.model,
        version_id=version.id,
        target=destination.target.name,
        deployment_id=destination.deployment_id,
        deployment=destination.deployment,
    )
