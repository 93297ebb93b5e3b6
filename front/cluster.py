"""A cluster's shared resources, opened one way by every entry process (an api replica, a
gateway): the database, Redis (refused unless it never evicts), the stream-URL signer, the
queue client, grouped inserts of new predictions, the event hub, the file store, the catalogue
cache and the front door over them. Each is closed by the caller's exit stack, in the reverse
order; a step that fails closes what the steps before it opened. The hub is opened, not
started: the caller starts it once the rest of its process is up."""

from __future__ import annotations

import functools
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Protocol

from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine

from catalog.cache import Catalog
from catalog.generation import CatalogGeneration
from director.queue import Queue
from files.links import FileLinks
from files.service import Files
from files.settings import FileSettings
from files.store import FileStore
from front.door import FrontDoor
from front.durable import Durable
from tracker.db import make_engine
from tracker.event_hub import EventHub
from tracker.events import EventLog
from tracker.group_commit import Batcher
from tracker.rate_limits import CreateRateLimit
from tracker.redis_connect import connect as connect_redis
from tracker.redis_connect import require_noeviction
from tracker.store import insert_predictions
from tracker.stream_urls import StreamSigner, StreamUrlSettings
from tracker.waiter_shares import WaiterShares


@dataclass(frozen=True, slots=True)
class ClusterOptions:
    """What an entry process's settings say of the shared resources."""

    database_url: str
    redis_url: str
    db_pool_size: int
    redis_pool_size: int
    #: Names of the process's Redis connections in ``CLIENT LIST`` (commands, the hub's reads).
    client_name: str
    hub_client_name: str
    max_waiters: int
    events_block_ms: int
    #: How the hub's places are shared between accounts and predictions.
    waiter_shares: WaiterShares
    events_retention: int
    cache_ttl: float
    #: Where file links point ("": under each request's own base URL).
    public_url: str
    create_rate_limit: str
    create_rate_burst: int | None


class EntrySettings(Protocol):
    """What the api's and the gateway's settings both say of the shared resources."""

    @property
    def database_url(self) -> str: ...
    @property
    def redis_url(self) -> str: ...
    @property
    def db_pool_size(self) -> int: ...
    @property
    def redis_pool_size(self) -> int: ...
    @property
    def max_waiters(self) -> int: ...
    @property
    def events_block_ms(self) -> int: ...
    @property
    def events_retention(self) -> int: ...
    @property
    def cache_ttl(self) -> float: ...
    @property
    def public_url(self) -> str | None: ...
    @property
    def create_rate_limit(self) -> str: ...
    @property
    def create_rate_burst(self) -> int | None: ...


def options_of(
    settings: EntrySettings, client_name: str, hub_client_name: str, shares: WaiterShares
) -> ClusterOptions:
    """An entry process's options, from its settings and the names of its Redis clients."""
    return ClusterOptions(
        database_url=settings.database_url,
        redis_url=settings.redis_url,
        db_pool_size=settings.db_pool_size,
        redis_pool_size=settings.redis_pool_size,
        client_name=client_name,
        hub_client_name=hub_client_name,
        max_waiters=settings.max_waiters,
        events_block_ms=settings.events_block_ms,
        waiter_shares=shares,
        events_retention=settings.events_retention,
        cache_ttl=settings.cache_ttl,
        public_url=settings.public_url or "",
        create_rate_limit=settings.create_rate_limit,
        create_rate_burst=settings.create_rate_burst,
    )


@dataclass(frozen=True, slots=True)
class Cluster:
    engine: AsyncEngine
    redis: Redis
    stream_signer: StreamSigner
    queue: Queue
    #: The process's one reader of prediction event streams.
    hub: EventHub
    events: EventLog
    catalog: Catalog
    file_settings: FileSettings
    file_store: FileStore
    files: Files
    #: Resolution, admission and the durable path of every create (:mod:`front`).
    front: FrontDoor


async def open_cluster(stack: AsyncExitStack, options: ClusterOptions) -> Cluster:
    engine = make_engine(options.database_url, pool_size=options.db_pool_size)
    stack.push_async_callback(engine.dispose)
    redis = connect_redis(
        options.redis_url,
        max_connections=options.redis_pool_size,
        client_name=options.client_name,
    )
    stack.push_async_callback(redis.aclose)
    await require_noeviction(redis)
    signer = StreamUrlSettings().signer(redis)
    # Not fatal: with Redis away the process still starts, and retries when it signs.
    await signer.reload()
    queue = Queue(redis)
    stack.push_async_callback(queue.close)
    new_predictions = Batcher(functools.partial(insert_predictions, engine))
    stack.push_async_callback(new_predictions.close)
    hub = EventHub.for_url(
        options.redis_url,
        redis,
        options.max_waiters,
        options.events_block_ms,
        options.hub_client_name,
        options.waiter_shares,
    )
    stack.push_async_callback(hub.close)
    file_settings = FileSettings()
    file_store = file_settings.store()
    stack.push_async_callback(file_store.close)
    files = Files(
        engine, file_store, FileLinks(options.public_url.rstrip("/"), signer), file_settings
    )
    catalog = Catalog(engine, options.cache_ttl, CatalogGeneration(redis))
    create_limit = CreateRateLimit.configured(
        redis, options.create_rate_limit, options.create_rate_burst
    )
    front = FrontDoor.of(catalog, Durable(new_predictions, queue, engine), files, create_limit)
    return Cluster(
        engine=engine,
        redis=redis,
        stream_signer=signer,
        queue=queue,
        hub=hub,
        events=EventLog(redis, options.events_retention),
        catalog=catalog,
        file_settings=file_settings,
        file_store=file_store,
        files=files,
        front=front,
    )
