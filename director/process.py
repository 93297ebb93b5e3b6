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
from director.director import Director
from director.fleet_member import FleetMember, Served
from director.outbound import Outbound
from director.probes import Probes
from director.queue import Queue
from director.queue import connect as connect_redis
from director.receiver import Receiver
from director.runner_client import RunnerClient
from director.settings import DirectorSettings
from tracker.batch_writes import StateWrites
from tracker.capabilities import StreamUrlSettings
from tracker.db import make_engine
from tracker.deliveries import Dispatcher
from tracker.events import EventLog
from tracker.fleet import FleetRegistry
from tracker.render import sign_stream_urls
from tracker.webhook_settings import WebhookSettings
from tracker.webhooks import open_session

log = logging.getLogger(__name__)


def director_id(settings: DirectorSettings) -> str:
    if settings.id:
        return settings.id
    digest = hashlib.sha256(f"{settings.deployment}|{settings.runner_url}".encode()).hexdigest()
    return f"{socket.gethostname()}-{digest[:10]}"


def _fleet_member(settings: DirectorSettings, director: Director, version_id: str) -> FleetMember:
    """Keeps the runner's fleet entry written while the director runs."""
    served = Served(
        url=(settings.runner_public_url or settings.runner_url).rstrip("/"),
        deployment=director.deployment.name,
        version_id=version_id,
        director=director.consumer,
        concurrency=settings.concurrency,
    )
    return FleetMember(
        FleetRegistry(director.redis, settings.fleet_ttl_seconds),
        director.monitor,
        served,
        director.stopping,
        settings.fleet_heartbeat_interval,
    )


def _json(value: object) -> str:
    # The request body of every start: orjson, not the standard library's encoder.
    return orjson.dumps(value).decode()


async def serve(settings: DirectorSettings) -> None:
    engine = make_engine(settings.database_url, pool_size=settings.concurrency + 4)
    redis = connect_redis(settings.redis_url)
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
    dispatcher = Dispatcher(engine, policy, webhook_session)
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
        deployment = await load_deployment(
            engine, settings.deployment, Queue(redis), settings.drain_shards
        )
        await receiver.start()
        runner = RunnerClient(settings.runner_url, session, settings.runner_token)
        director = Director(
            settings,
            deployment,
            StateWrites(engine),
            redis,
            runner,
            attempts,
            consumer=director_id(settings),
            outbound=outbound,
            webhook_url=receiver.webhook_url,
        )
        receiver.probes = Probes(director, engine, redis, runner, settings.loop_stall_after)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, director.stopping.set)
        log.info(
            "director %s for %s reading %d streams, runner %s, receiver %s",
            director.consumer,
            deployment.name,
            len(director.intake.streams),
            settings.runner_url,
            receiver.public_url,
        )
        member = _fleet_member(settings, director, deployment.version_id)
        beats = asyncio.create_task(member.run(), name="fleet-heartbeat")
        try:
            await director.run()
        finally:
            beats.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beats
            await member.leave()
    finally:
        await dispatcher.stop()
        await webhook_session.close()
        await receiver.stop()
        await session.close()
        await redis.aclose()
        await engine.dispose()
