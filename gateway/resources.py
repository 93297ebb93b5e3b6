"""What a gateway process opens once and shares between its calls: the database, Redis, the
queue, the catalog cache, the front door (:mod:`front`), the event hub, the fleet view, the file
store and (optionally) the synchronous lane. Each is closed by the caller's exit stack, in the
reverse order."""

from __future__ import annotations

from contextlib import AsyncExitStack
from dataclasses import dataclass

from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine

from catalog.cache import Catalog
from director.queue import Queue
from files.service import Files
from front.cluster import open_cluster, options_of
from front.door import FrontDoor
from gateway.peers import Peers, RemoteBlocks
from gateway.settings import GatewaySettings
from lane.service import Lane
from lane.settings import LaneSettings
from tracker.db import make_engine
from tracker.event_hub import EventHub
from tracker.events import EventLog
from tracker.fleet import FleetView
from tracker.waiter_shares import WaiterShares

#: Names of the gateway's Redis connections in ``CLIENT LIST``.
CLIENT_NAME = "conduit-gateway"
HUB_CLIENT_NAME = "conduit-gateway-events"


@dataclass
class GatewayResources:
    settings: GatewaySettings
    engine: AsyncEngine
    redis: Redis
    queue: Queue
    catalog: Catalog
    #: Resolution, admission and the durable path of every task (:mod:`front`).
    front: FrontDoor
    #: The process's one reader of prediction event streams.
    hub: EventHub
    events: EventLog
    #: Which runners are ready, for ``UNAVAILABLE`` before anything is queued.
    fleet: FleetView
    files: Files
    #: The synchronous lane, when this gateway joins it (``CONDUIT_GATEWAY_LANE``).
    lane: Lane | None = None
    #: The registry's database (this cluster's own unless ``registry_database_url`` names
    #: another), other clusters' blocks and the calls to their gateways: with a cluster id.
    registry_engine: AsyncEngine | None = None
    remote: RemoteBlocks | None = None
    peers: Peers | None = None


async def open_resources(stack: AsyncExitStack, settings: GatewaySettings) -> GatewayResources:
    """Open everything, each closed by ``stack``: a step that fails closes what the steps
    before it opened. What every entry shares is opened by the front door's
    :func:`~front.cluster.open_cluster`."""
    # Every waiter of the gateway is a task its own caller waits for: one account may take
    # every place, as it takes every call it makes.
    options = options_of(settings, CLIENT_NAME, HUB_CLIENT_NAME, WaiterShares())
    cluster = await open_cluster(stack, options)
    engine, redis = cluster.engine, cluster.redis
    lane = None
    if settings.lane:
        lane = Lane(redis, engine, LaneSettings())
        stack.push_async_callback(lane.stop)
        fleet = lane.fleet
    else:
        fleet = FleetView(redis)
        stack.push_async_callback(fleet.stop)
    registry_engine = remote = peers = None
    if settings.cluster_id is not None:
        registry_engine = engine
        if settings.registry_database_url:
            registry_engine = make_engine(settings.registry_database_url, pool_size=2)
            stack.push_async_callback(registry_engine.dispose)
        remote = RemoteBlocks(registry_engine, settings.cluster_id, settings.cache_ttl)
        peers = Peers(settings)
        stack.push_async_callback(peers.close)
    resources = GatewayResources(
        settings=settings,
        engine=engine,
        redis=redis,
        queue=cluster.queue,
        catalog=cluster.catalog,
        front=cluster.front,
        hub=cluster.hub,
        events=cluster.events,
        fleet=fleet,
        files=cluster.files,
        lane=lane,
        registry_engine=registry_engine,
        remote=remote,
        peers=peers,
    )
    if lane is not None:
        await lane.start()
    else:
        await fleet.start()
    cluster.hub.start()
    return resources
