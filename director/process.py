"""The director process: open its connections, build and wire its parts, handle signals.

The composition root: every part a director runs with (its metrics, its ledger of prediction
rows, its queue, drivers, leases, intake and reconciler) is built here, once per process.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import logging
import signal
import socket
from collections.abc import Callable, Sequence
from dataclasses import replace

import aiohttp
import orjson
from redis.asyncio import Redis

from catalog.generation import CatalogGeneration
from director.attempts import Attempt, Attempts
from director.cancels import Suspicion
from director.claims import Claims
from director.deployment import ServedDeployment, load_deployment
from director.director import Director
from director.drivers import DeploymentDriver, DeploymentDrivers
from director.fleet_member import fleet_member
from director.handling import AttemptHandler
from director.intake import Intake
from director.jobs import PREDICTIONS, JobKind, Trainings
from director.leases import Heartbeats, Takeover
from director.metrics import DirectorMetrics
from director.outbound import Outbound
from director.output_files import OutputStore
from director.pool_slots import PoolSlots
from director.probes import Probes
from director.queue import Queue
from director.queue import connect as connect_redis
from director.read_order import ReadOrder
from director.receiver import Receiver
from director.reclaim import Reclaimer
from director.reconciler import Reconciler
from director.release_watch import ReleaseWatch
from director.runner_monitor import RunnerMonitor
from director.settings import DirectorSettings, Route
from director.trainings import TrainingResults
from files.links import FileLinks
from files.service import Files
from files.settings import FileSettings
from protocol.client import RunnerClient, without_resends
from tracker.batch_writes import StateWrites
from tracker.capabilities import StreamUrlSettings
from tracker.db import make_engine
from tracker.deliveries import Dispatcher
from tracker.events import EventLog
from tracker.ledger import Ledger
from tracker.redis_connect import require_noeviction
from tracker.render import PredictionLinks
from tracker.webhook_settings import WebhookSettings
from tracker.webhooks import open_session

log = logging.getLogger(__name__)

#: A deployment served, the runner it runs on, and that runner's pool slot model (if any).
Serving = tuple[ServedDeployment, RunnerClient, str | None]


def director_id(settings: DirectorSettings) -> str:
    """The consumer name: ``id``, else host name + a hash of what it serves (one deployment:
    deployment and runner URL, as before several could be served)."""
    if settings.id:
        return settings.id
    served = ",".join(f"{route.deployment}|{route.runner_url}" for route in settings.routes())
    digest = hashlib.sha256(served.encode()).hexdigest()
    return f"{socket.gethostname()}-{digest[:10]}"


def build_director(
    settings: DirectorSettings,
    served: Sequence[Serving],
    ledger: Ledger,
    redis: Redis,
    attempts: Attempts,
    consumer: str,
    outbound: Outbound,
    webhook_url: Callable[[Attempt], str],
    metrics: DirectorMetrics,
    output: OutputStore | None = None,
    job: JobKind = PREDICTIONS,
) -> Director:
    """A director and its parts. ``served``: each deployment with its runner (and pool slot
    model), in the order given. ``ledger``: the process's way into prediction rows.
    ``webhook_url(attempt)``: where the runner sends that claimed attempt's snapshots (the
    receiver, which shares ``attempts``; the URL holds the attempt's secret). ``output``: where
    output files go (None: runners send them inline). ``job``: what it runs, predictions or (a
    director of ``job_kind`` training) trainings."""
    queue = Queue(redis)
    reclaimer = Reclaimer(queue, consumer)
    heartbeats = Heartbeats(
        redis,
        reclaimer,
        ledger,
        attempts,
        metrics,
        interval=settings.heartbeat_every,
        visibility_timeout=settings.visibility_timeout,
    )
    claims = Claims(ledger, queue, consumer, outbound.events, outbound.links)
    suspicion = Suspicion()
    drivers = DeploymentDrivers(
        [
            _lane(
                settings,
                d,
                runner,
                model,
                ledger,
                outbound,
                claims,
                reclaimer,
                webhook_url,
                suspicion,
                metrics,
                output,
                job,
            )
            for d, runner, model in served
        ]
    )
    deployments = [driver.deployment for driver in drivers]
    draining = [
        stream
        for d in deployments
        for stream in d.draining(settings.drain_shards, settings.drain_streams.split(","))
    ]
    intake = Intake(
        queue,
        reclaimer,
        attempts,
        heartbeats,
        [d.streams() for d in deployments],
        list(dict.fromkeys(draining)),
        retry_interval=settings.retry_interval,
        block_ms=settings.block_ms,
    )
    read_order = _read_order(settings, queue, intake, drivers, metrics)
    if read_order is not None:
        intake.order = read_order.order
    takeover = Takeover(
        reclaimer,
        intake,
        attempts.free,
        int(settings.visibility_timeout * 1000),
        legacy=functools.partial(_legacy_backlog, drivers, queue, settings.drain_shards),
        metrics=metrics,
    )
    targets = [target for d in deployments for target in d.targets]
    reconciler = Reconciler(
        settings, ledger.engine, queue, targets, lambda: intake.all_streams, consumer, metrics
    )
    return Director(
        settings,
        redis=redis,
        engine=ledger.engine,
        consumer=consumer,
        attempts=attempts,
        queue=queue,
        drivers=drivers,
        intake=intake,
        heartbeats=heartbeats,
        takeover=takeover,
        reconciler=reconciler,
        read_order=read_order,
        suspicion=suspicion,
        # A trainer reads its version's trainings, whatever version the deployment runs.
        release_watch=None
        if settings.job_kind == "training"
        else ReleaseWatch(ledger.engine, intake, deployments),
    )


def _lane(
    settings: DirectorSettings,
    deployment: ServedDeployment,
    runner: RunnerClient,
    model: str | None,
    ledger: Ledger,
    outbound: Outbound,
    claims: Claims,
    reclaimer: Reclaimer,
    webhook_url: Callable[[Attempt], str],
    suspicion: Suspicion,
    metrics: DirectorMetrics,
    output: OutputStore | None,
    job: JobKind,
) -> DeploymentDriver:
    monitor = RunnerMonitor(runner, settings.runner_check_interval, settings.runner_check_failures)
    handler = AttemptHandler(
        settings=settings,
        deployment=deployment,
        ledger=ledger,
        runner=runner,
        monitor=monitor,
        outbound=outbound,
        claims=claims,
        reclaimer=reclaimer,
        webhook_url=webhook_url,
        on_cancel_ignored=functools.partial(suspicion.ignored_cancel, monitor),
        metrics=metrics,
        output=output,
        job=job,
    )
    return DeploymentDriver(deployment, runner, monitor, handler, model)


def _read_order(
    settings: DirectorSettings,
    queue: Queue,
    intake: Intake,
    drivers: DeploymentDrivers,
    metrics: DirectorMetrics,
) -> ReadOrder | None:
    """With several deployments: the order their streams are read in."""
    if len(drivers) <= 1:
        return None
    first = drivers[0].runner
    slots = None
    if settings.pool_url is not None:
        slots = PoolSlots(settings.pool_url, first.session, first.auth)
    return ReadOrder(
        queue,
        intake.groups,
        [driver.deployment.name for driver in drivers],
        [driver.model for driver in drivers],
        slots,
        settings.aging_bound,
        metrics,
    )


async def _legacy_backlog(
    drivers: DeploymentDrivers, queue: Queue, shards: int | None
) -> list[str]:
    """The served deployments' untagged streams that hold entries now."""
    found: list[str] = []
    for driver in drivers:
        found += await driver.deployment.legacy_backlog(queue, shards)
    return found


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
                deployment = await load_deployment(
                    engine, route.deployment, Queue(redis), settings.drain_shards, settings.version
                )
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
