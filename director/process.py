"""The director process: open its connections, wire the parts, handle signals."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import signal
import socket

import aiohttp
import orjson

from director.attempts import Attempts
from director.deployment import load_deployment
from director.director import Director, Serving
from director.fleet_member import FleetMember, Served
from director.lanes import Lane
from director.outbound import Outbound
from director.probes import Probes
from director.queue import Queue
from director.queue import connect as connect_redis
from director.receiver import Receiver
from director.runner_client import RunnerClient
from director.settings import DirectorSettings, Route
from tracker.batch_writes import StateWrites
from tracker.capabilities import StreamUrlSettings
from tracker.db import make_engine
from tracker.deliveries import Dispatcher
from tracker.events import EventLog
from tracker.fleet import FleetRegistry
from tracker.redis_connect import require_noeviction
from tracker.render import sign_stream_urls
from tracker.webhook_settings import WebhookSettings
from tracker.webhooks import open_session

log = logging.getLogger(__name__)


def director_id(settings: DirectorSettings) -> str:
    """The consumer name: ``id``, else host name + a hash of what it serves (one deployment:
    deployment and runner URL, as before several could be served)."""
    if settings.id:
        return settings.id
    served = ",".join(f"{route.deployment}|{route.runner_url}" for route in settings.routes())
    digest = hashlib.sha256(served.encode()).hexdigest()
    return f"{socket.gethostname()}-{digest[:10]}"


def _fleet_member(
    settings: DirectorSettings, director: Director, lane: Lane, route: Route
) -> FleetMember:
    """Keeps one runner's fleet entry written while the director runs."""
    served = Served(
        url=settings.fleet_url(route),
        deployment=lane.deployment.name,
        version_id=lane.deployment.version_id,
        director=director.consumer,
        concurrency=settings.concurrency,
    )
    return FleetMember(
        FleetRegistry(director.redis, settings.fleet_ttl_seconds),
        lane.monitor,
        served,
        director.stopping,
        settings.fleet_heartbeat_interval,
    )


def _health_urls(settings: DirectorSettings, routes: list[Route]) -> list[str]:
    """Where the readiness probe asks each runner's ``/health``: a pool host answers it at
    its root, for all its slots."""
    if settings.pool_url is not None:
        return [settings.pool_url.rstrip("/")]
    return [route.runner_url.rstrip("/") for route in routes]


def _json(value: object) -> str:
    # The request body of every start: orjson, not the standard library's encoder.
    return orjson.dumps(value).decode()


async def serve(settings: DirectorSettings) -> None:
    routes = settings.routes()
    redis = connect_redis(settings.redis_url)
    try:
        # Before anything starts (receiver, webhooks, the fleet entry): a director refused
        # here has nothing to undo but this connection.
        await require_noeviction(redis)
    except BaseException:
        await redis.aclose()
        raise
    engine = make_engine(settings.database_url, pool_size=settings.concurrency + 4)
    timeout = aiohttp.ClientTimeout(total=30, connect=5)
    session = aiohttp.ClientSession(
        timeout=timeout,
        connector=aiohttp.TCPConnector(limit=settings.concurrency * 2 + 8),
        json_serialize=_json,
    )
    attempts = Attempts(settings.concurrency)
    receiver = Receiver(
        settings.receiver_host, settings.receiver_port, settings.receiver_url, attempts
    )
    policy = WebhookSettings().policy(settings.public_url)
    webhook_session = open_session(policy)
    dispatcher = Dispatcher(engine, policy, webhook_session, redis=redis)
    outbound = Outbound(
        engine,
        EventLog(redis, settings.events_retention, settings.events_max_len),
        policy,
        webhook_session,
        dispatcher,
    )
    try:
        # Webhook bodies carry urls.stream signed with the key the api checks.
        sign_stream_urls(await StreamUrlSettings().loaded_signer(redis))
        dispatcher.start()
        served: list[Serving] = []
        for route in routes:
            deployment = await load_deployment(
                engine, route.deployment, Queue(redis), settings.drain_shards
            )
            runner = RunnerClient(route.runner_url, session, settings.runner_token)
            served.append((deployment, runner, route.model))
        await receiver.start()
        director = Director(
            settings,
            served,
            StateWrites(engine),
            redis,
            attempts,
            consumer=director_id(settings),
            outbound=outbound,
            webhook_url=receiver.webhook_url,
        )
        receiver.probes = Probes(
            director,
            engine,
            redis,
            session,
            _health_urls(settings, routes),
            settings.loop_stall_after,
        )
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, director.stopping.set)
        log.info(
            "director %s for %s reading %d streams, receiver %s",
            director.consumer,
            ", ".join(f"{route.deployment} on {route.runner_url}" for route in routes),
            len(director.intake.streams),
            receiver.public_url,
        )
        members = [
            _fleet_member(settings, director, lane, route)
            for lane, route in zip(director.lanes, routes, strict=True)
        ]
        beats = [asyncio.create_task(m.run(), name="fleet-heartbeat") for m in members]
        try:
            await director.run()
        finally:
            for beat in beats:
                beat.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await beat
            for member in members:
                await member.leave()
    finally:
        await dispatcher.stop()
        await webhook_session.close()
        await receiver.stop()
        await session.close()
        await redis.aclose()
        await engine.dispose()
