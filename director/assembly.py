"""A director put together from its parts (:func:`build_director`): its queue, one driver per
deployment served (runner monitor and attempt handler), heartbeats and takeover, intake and read
order, reconciler and release watch. The process (:mod:`director.process`) opens what they share
and calls it once."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

from redis.asyncio import Redis

from director.attempts import Attempt, Attempts
from director.cancels import Suspicion
from director.claims import Claims
from director.deployment import ServedDeployment
from director.director import Director
from director.drivers import DeploymentDriver, DeploymentDrivers
from director.handling import AttemptHandler
from director.intake import Intake
from director.jobs import PREDICTIONS, JobKind
from director.leases import Heartbeats, Takeover
from director.metrics import DirectorMetrics
from director.outbound import Outbound
from director.output_files import OutputStore
from director.pool_slots import PoolSlots
from director.queue import Queue
from director.read_order import ReadOrder
from director.reclaim import Reclaimer
from director.reconciler import Reconciler
from director.release_watch import ReleaseWatch
from director.runner_monitor import RunnerMonitor
from director.settings import DirectorSettings
from protocol.client import RunnerClient
from tracker.ledger import Ledger

#: A deployment served, the runner it runs on, and that runner's pool slot model (if any).
Serving = tuple[ServedDeployment, RunnerClient, str | None]


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
