"""What a gateway process opens once and shares between its calls: the database, Redis, the
queue, the catalog cache, the front door (:mod:`front`), the event hub, the fleet view, the file
store and (optionally) the synchronous lane. Each is closed by the caller's exit stack, in the
reverse order."""

from __future__ import annotations

import functools
from contextlib import AsyncExitStack
from dataclasses import dataclass

from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine

from catalog.cache import Catalog
from catalog.generation import CatalogGeneration
from director.queue import Queue
from files.links import FileLinks
from files.service import Files
from files.settings import FileSettings
from front.door import FrontDoor
from front.durable import Durable
from gateway.peers import Peers, RemoteBlocks
from gateway.settings import GatewaySettings
from lane.service import Lane
from lane.settings import LaneSettings
from tracker.db import make_engine
from tracker.event_hub import EventHub
from tracker.events import EventLog
from tracker.fleet import FleetView
from tracker.group_commit import Batcher
from tracker.rate_limits import CreateRateLimit
from tracker.redis_connect import connect as connect_redis
from tracker.redis_connect import require_noeviction
from tracker.store import insert_predictions
from tracker.stream_urls import StreamUrlSettings
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
    before it opened."""
    engine = make_engine(settings.database_url, pool_size=settings.db_pool_size)
    stack.push_async_callback(engine.dispose)
    redis = connect_redis(
        settings.redis_url, max_connections=settings.redis_pool_size, client_name=CLIENT_NAME
    )
    stack.push_async_callback(redis.aclose)
    await require_noeviction(redis)
    signer = StreamUrlSettings().signer(redis)
    await signer.reload()  # not fatal: retried when a file needs signing
    queue = Queue(redis)
    stack.push_async_callback(queue.close)
    new_predictions = Batcher(functools.partial(insert_predictions, engine))
    stack.push_async_callback(new_predictions.close)
    hub = EventHub.for_url(
        settings.redis_url,
        redis,
        settings.max_waiters,
        settings.events_block_ms,
        HUB_CLIENT_NAME,
        # Every waiter of the gateway is a task its own caller waits for: one account may take
        # every place, as it takes every call it makes.
        WaiterShares(),
    )
    stack.push_async_callback(hub.close)
    lane = None
    if settings.lane:
        lane = Lane(redis, engine, LaneSettings())
        stack.push_async_callback(lane.stop)
        fleet = lane.fleet
    else:
        fleet = FleetView(redis)
        stack.push_async_callback(fleet.stop)
    file_settings = FileSettings()
    file_store = file_settings.store()
    stack.push_async_callback(file_store.close)
    files = Files(
        engine, file_store, FileLinks(settings.public_url.rstrip("/"), signer), file_settings
    )
    registry_engine = remote = peers = None
    if settings.cluster_id is not None:
        registry_engine = engine
        if settings.registry_database_url:
            registry_engine = make_engine(settings.registry_database_url, pool_size=2)
            stack.push_async_callback(registry_engine.dispose)
        remote = RemoteBlocks(registry_engine, settings.cluster_id, settings.cache_ttl)
        peers = Peers(settings)
        stack.push_async_callback(peers.close)
    catalog = Catalog(engine, settings.cache_ttl, CatalogGeneration(redis))
    # The account's rate of creates, the api's own (None: not limited).
    create_limit = CreateRateLimit.configured(
        redis, settings.create_rate_limit, settings.create_rate_burst
    )
    durable = Durable(new_predictions, queue, engine)
    resources = GatewayResources(
        settings=settings,
        engine=engine,
        redis=redis,
        queue=queue,
        catalog=catalog,
        front=FrontDoor.of(catalog, durable, files, create_limit),
        hub=hub,
        events=EventLog(redis, settings.events_retention),
        fleet=fleet,
        files=files,
        lane=lane,
        registry_engine=registry_engine,
        remote=remote,
        peers=peers,
    )
    if lane is not None:
        await lane.start()
    else:
        await fleet.start()
    hub.start()
    return resources
