"""The public API: Replicate-compatible routes over Postgres and the Redis Streams queue.

``create_app(settings)`` builds the app; the lifespan opens one engine, one Redis pool, the
event hub (one reader of event streams for all waiters), the catalog cache, the bearer-token
authenticator and the stream URL signer on ``app.state`` and closes them at exit, through one
exit stack: a step that fails at startup closes what the steps before it opened. The API never
runs predictions: it stores them, queues them and reports on them.
"""

from __future__ import annotations

import asyncio
import functools
import signal
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack, asynccontextmanager, contextmanager
from types import FrameType

from fastapi import FastAPI

from api import error_handlers, openapi, ops
from api.auth import Authenticator
from api.body_auth import AuthenticateBeforeBody
from api.deps import Resources
from api.encoding import RefuseContentEncoding
from api.limits import BodySizeLimit
from api.metrics import ApiMetrics, MetricsServer, RequestMetrics
from api.metrics import router as metrics_router
from api.request_ids import RequestIds
from api.routes import (
    account,
    blocks,
    files,
    fleet,
    graphs,
    hardware,
    health,
    manage,
    models,
    predictions,
    registry,
    request_logs,
    run,
    streams,
    trainings,
    usage,
    webhooks,
)
from api.settings import ApiSettings
from catalog import lookups
from files.retention import RetentionSweep
from front.cluster import open_cluster, options_of
from lane.service import Lane
from lane.settings import LaneSettings
from tracker import keys
from tracker.db import make_engine
from tracker.deliveries import Dispatcher
from tracker.event_hub import EventHub
from tracker.rate_limits import CreateRateLimit
from tracker.waiter_shares import WaiterShares
from tracker.webhook_settings import WebhookSettings
from tracker.webhooks import open_session

#: Names of the api's Redis connections in ``CLIENT LIST``.
CLIENT_NAME = "conduit-api"
HUB_CLIENT_NAME = "conduit-api-events"


@contextmanager
def release_on_exit_signals(hub: EventHub) -> Iterator[None]:
    """Answer every waiter as soon as SIGTERM or SIGINT arrives.

    The server stops on those signals only after its open requests end, and runs the lifespan's
    exit after that: a waiter released there would first have held the shutdown for its whole
    wait. So the server's own handlers are chained, not replaced (they are restored at exit).
    """
    if threading.current_thread() is not threading.main_thread():
        yield  # signals reach the main thread only (an app served from a test's thread)
        return
    loop = asyncio.get_running_loop()
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}

    def handle(sig: int, frame: FrameType | None) -> None:
        loop.call_soon_threadsafe(hub.release)
        chained = previous[signal.Signals(sig)]
        if callable(chained):
            chained(sig, frame)
        elif chained == signal.SIG_DFL:  # no server handler: end the process as before
            signal.signal(sig, signal.SIG_DFL)
            signal.raise_signal(sig)

    for sig in previous:
        signal.signal(sig, handle)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            if signal.getsignal(sig) is handle:
                signal.signal(sig, handler)


async def _open(
    stack: AsyncExitStack, app: FastAPI, settings: ApiSettings, lane_env: LaneSettings
) -> Resources:
    """Open the api's resources, each closed by ``stack`` (in the reverse order): a step that
    fails closes what the steps before it opened. What every entry shares is opened by the front
    door's :func:`~front.cluster.open_cluster`."""
    shares = WaiterShares.of(
        settings.max_waiters, settings.max_waiters_per_account, settings.max_waiters_per_prediction
    )
    cluster = await open_cluster(stack, options_of(settings, CLIENT_NAME, HUB_CLIENT_NAME, shares))
    engine, redis = cluster.engine, cluster.redis
    replica = None
    if settings.database_read_url:
        replica = make_engine(settings.database_read_url, pool_size=settings.db_pool_size)
        stack.push_async_callback(replica.dispose)
    log_engine = None
    if settings.log_database_url:
        log_engine = make_engine(settings.log_database_url, pool_size=2)
        stack.push_async_callback(log_engine.dispose)
    policy = WebhookSettings().policy(settings.public_url or "")
    webhook_session = open_session(policy)
    stack.push_async_callback(webhook_session.close)
    lane = Lane(redis, engine, lane_env, on_wait=app.state.metrics.lane_wait.observe)
    stack.push_async_callback(lane.stop)
    # One reader of the fleet registry: the webhook guard follows the lane's view.
    dispatcher = Dispatcher(engine, policy, webhook_session, fleet=lane.fleet)
    stack.push_async_callback(dispatcher.stop)
    file_settings = cluster.file_settings
    # Every replica sweeps; SKIP LOCKED shares the due rows between them.
    retention = RetentionSweep(engine, cluster.file_store, file_settings).periodic(
        file_settings.sweep_interval
    )
    stack.push_async_callback(retention.stop)
    resources = Resources(
        settings=settings,
        engine=engine,
        redis=redis,
        queue=cluster.queue,
        catalog=cluster.catalog,
        auth=Authenticator(functools.partial(lookups.account_for_token, engine), settings),
        stream_signer=cluster.stream_signer,
        events=cluster.events,
        hub=cluster.hub,
        webhooks=policy,
        dispatcher=dispatcher,
        front=cluster.front,
        replica=replica,
        lane=lane,
        upload_limit=CreateRateLimit.configured(
            redis,
            file_settings.upload_rate_limit,
            file_settings.upload_rate_burst,
            keys.upload_rate_key,
            "files uploaded",
        ),
        files=cluster.files,
        log_engine=log_engine,
    )
    await lane.start()
    dispatcher.start()
    retention.start()
    cluster.hub.start()
    if settings.metrics_port is not None:
        metrics_server = MetricsServer(
            app.state.metrics, settings.metrics_host, settings.metrics_port
        )
        stack.push_async_callback(metrics_server.stop)
        await metrics_server.start()
    return resources


def create_app(settings: ApiSettings, lane_settings: LaneSettings | None = None) -> FastAPI:
    lane_env = lane_settings or LaneSettings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with AsyncExitStack() as stack:
            app.state.resources = await _open(stack, app, settings, lane_env)
            stack.push_async_callback(ops.stop, app)
            await ops.start(app)
            stack.enter_context(release_on_exit_signals(app.state.resources.hub))
            yield

    app = FastAPI(title="Conduit", version="0.1.0", lifespan=lifespan)
    error_handlers.install(app)
    openapi.install(app)
    app.include_router(predictions.router)
    app.include_router(account.router)
    app.include_router(models.router)
    app.include_router(manage.router)
    app.include_router(trainings.router)
    app.include_router(run.router)
    app.include_router(streams.router)
    app.include_router(webhooks.router)
    app.include_router(usage.router)
    app.include_router(fleet.router)
    app.include_router(hardware.router)
    app.include_router(files.router)
    app.include_router(registry.router)
    app.include_router(request_logs.router)
    app.include_router(blocks.router)
    app.include_router(graphs.router)
    app.include_router(health.router)
    ops.install(app, settings)
    # Uploads stream into the file store, held to the files' own limit (``api.routes.files``).
    app.add_middleware(
        BodySizeLimit, max_bytes=settings.max_body_bytes, exempt=[("POST", "/v1/files")]
    )
    # Outside the size limit: an encoded body is refused before a byte of it is counted.
    app.add_middleware(RefuseContentEncoding)
    # Outside the size limit: a request with a body is authenticated before anything of it is
    # read or judged.
    app.add_middleware(
        AuthenticateBeforeBody,
        authenticator=lambda: getattr(getattr(app.state, "resources", None), "auth", None),
    )
    # Metrics and request ids: one registry per app; the id outermost, so that every answer
    # (a refused body's too) carries it.
    app.state.metrics = ApiMetrics()
    app.state.metrics.watch(lambda: getattr(app.state, "resources", None))
    app.include_router(metrics_router)
    app.add_middleware(RequestMetrics, metrics=app.state.metrics)
    app.add_middleware(RequestIds)
    return app
