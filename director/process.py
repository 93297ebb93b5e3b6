"""The director process: open its connections, build and wire its parts, handle signals.

The composition root: what a director process shares (its connections, metrics, ledger of
prediction rows, receiver, outbound events and webhooks, files) is opened here, once per
process, and the director is put together from it (its queue, drivers, leases, intake and
reconciler: :func:`director.assembly.build_director`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import signal
import socket
from dataclasses import replace

import aiohttp
import orjson

from catalog.generation import CatalogGeneration
from director.assembly import Serving, build_director
from director.attempts import Attempts
from director.deployment import load_deployment
from director.fleet_member import fleet_member
from director.jobs import PREDICTIONS, Trainings
from director.metrics import DirectorMetrics
from director.outbound import Outbound
from director.output_files import OutputStore
from director.probes import Probes
from director.queue import connect as connect_redis
from director.receiver import Receiver
from director.settings import DirectorSettings, Route
from director.trainings import TrainingResults
from files.links import FileLinks
from files.service import Files
from files.settings import FileSettings
from protocol.client import RunnerClient
from protocol.session import without_resends
from tracker.batch_writes import StateWrites
from tracker.db import make_engine
from tracker.deliveries import Dispatcher
from tracker.events import EventLog
from tracker.ledger import Ledger
from tracker.redis_connect import require_noeviction
from tracker.render import PredictionLinks
from tracker.stream_urls import StreamUrlSettings
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


def _health_urls(settings: DirectorSettings, routes: list[Route]) -> list[str]:
    """Where the readiness probe asks each runner's ``/health``: a pool host answers it at
    its root, for all its slots."""
    if settings.pool_url is not None:
        return [settings.pool_url.rstrip("/")]
    return [route.runner_url.rstrip("/") for route in routes]


def _json(value: object) -> str:
    # The request body of every start: orjson, not the standard library's encoder.
    return orjson.dumps(value).decode()


def _no_deployment(settings: DirectorSettings, error: LookupError) -> str:
    """The one line a director whose deployment is missing exits with."""
    what = "trainer director" if settings.job_kind == "training" else "director"
    return (
        f"conduit director: {error}: a {what} serves a deployment; create it first"
        " (conduit admin create-deployment OWNER/NAME --model OWNER/MODEL, or POST /v1/deployments)"
    )


async def serve(settings: DirectorSettings) -> None:
    routes = settings.routes()
    file_settings = FileSettings()
    file_store = file_settings.store()  # a misconfigured store stops it before anything runs
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
    # Idle connections are closed here before a runner closes them (uvicorn, under a stock Cog
    # server, after 5 s): a start sent down one the runner is closing would break off, and is
    # not sent again (``without_resends``).
    connector = aiohttp.TCPConnector(limit=settings.concurrency * 2 + 8, keepalive_timeout=4.0)
    session = without_resends(
        aiohttp.ClientSession(timeout=timeout, connector=connector, json_serialize=_json)
    )
    attempts = Attempts(settings.concurrency)
    metrics = DirectorMetrics()
    policy = WebhookSettings().policy(settings.public_url)
    webhook_session = open_session(policy)
    dispatcher = Dispatcher(engine, policy, webhook_session, redis=redis)
    # Webhook bodies and final events carry urls.stream signed with the key the api checks.
    signer = StreamUrlSettings().signer(redis)
    # Output files' URLs are delivery URLs the api serves, signed with the same key.
    files = Files(engine, file_store, FileLinks(policy.public_url, signer), file_settings)
    output = OutputStore(files, file_settings.inline_max)
    receiver = Receiver(
        settings.receiver_host,
        settings.receiver_port,
        settings.receiver_url,
        attempts,
        metrics,
        output=output,
        upload_token=settings.upload_token,
    )
    outbound = Outbound(
        engine,
        EventLog(redis, settings.events_retention, settings.events_max_len),
        policy,
        webhook_session,
        dispatcher,
        PredictionLinks(policy.public_url, signer),
    )
    try:
        await signer.load()
        dispatcher.start()
        served: list[Serving] = []
        for route in routes:
            try:
                deployment = await load_deployment(engine, route.deployment, settings.version)
            except LookupError as error:
                raise SystemExit(_no_deployment(settings, error)) from None
            deployment = replace(deployment, job_kind=settings.job_kind)
            runner = RunnerClient(
                route.runner_url,
                session,
                settings.runner_token,
                trainings=deployment.trains,
            )
            served.append((deployment, runner, route.model))
        await receiver.start()
        director = build_director(
            settings,
            served,
            Ledger(StateWrites(engine)),
            redis,
            attempts,
            consumer=director_id(settings),
            outbound=outbound,
            webhook_url=receiver.webhook_url,
            metrics=metrics,
            output=output,
            job=(
                Trainings(TrainingResults(engine, files, CatalogGeneration(redis)))
                if settings.job_kind == "training"
                else PREDICTIONS
            ),
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
        # A trainer is no runner of the deployment's: the fleet (and the synchronous lane,
        # which routes by it) must not send it predictions.
        members = [
            fleet_member(settings, director, driver, route)
            for driver, route in zip(director.drivers, routes, strict=True)
            if not driver.deployment.trains
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
        await file_store.close()
        await session.close()
        await redis.aclose()
        await engine.dispose()
