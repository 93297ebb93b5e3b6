"""The public API: Replicate-compatible routes over Postgres and the Redis Streams queue.

``create_app(settings)`` builds the app; the lifespan opens one engine, one Redis pool and the
catalog cache on ``app.state`` and closes them at exit. The API never runs predictions: it
stores them, queues them and reports on them.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from api import errors, openapi
from api.cache import Catalog
from api.deps import Resources
from api.limits import BodySizeLimit
from api.routes import health, models, predictions, streams, usage, webhooks
from api.settings import ApiSettings
from director.queue import Queue
from director.queue import connect as connect_redis
from tracker.db import make_engine
from tracker.deliveries import Dispatcher
from tracker.events import EventLog
from tracker.group_commit import Batcher
from tracker.store import insert_predictions
from tracker.webhook_settings import WebhookSettings
from tracker.webhooks import open_session


def create_app(settings: ApiSettings) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine = make_engine(settings.database_url, pool_size=settings.db_pool_size)
        redis = connect_redis(settings.redis_url)
        policy = WebhookSettings().policy(settings.public_url or "")
        webhook_session = open_session(policy)
        dispatcher = Dispatcher(engine, policy, webhook_session)
        app.state.resources = Resources(
            settings=settings,
            engine=engine,
            redis=redis,
            queue=Queue(redis),
            catalog=Catalog(engine, settings.cache_ttl),
            events=EventLog(redis, settings.events_retention),
            webhooks=policy,
            dispatcher=dispatcher,
            new_predictions=Batcher(functools.partial(insert_predictions, engine)),
        )
        dispatcher.start()
        try:
            yield
        finally:
            await app.state.resources.new_predictions.close()
            await app.state.resources.queue.close()
            await dispatcher.stop()
            await webhook_session.close()
            await redis.aclose()
            await engine.dispose()

    app = FastAPI(title="Conduit", version="0.1.0", lifespan=lifespan)
    errors.install(app)
    openapi.install(app)
    app.include_router(predictions.router)
    app.include_router(models.router)
    app.include_router(streams.router)
    app.include_router(webhooks.router)
    app.include_router(usage.router)
    app.include_router(health.router)
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_body_bytes)
    return app
