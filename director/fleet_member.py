"""The director's part in the fleet registry (``tracker.fleet``): it keeps its runner's entry
written while it runs, so every runner it drives is known, stock Cog servers included.

The entry says what the runner monitor knows (state, hardware, advertised slots) and what the
director serves; it turns ``draining`` once the director is stopping, and is deleted when the
director is done. A director that dies leaves an entry that expires a few heartbeats later.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from core.periodic import Periodic
from core.transient import TRANSIENT
from director.runner_monitor import RunnerMonitor
from tracker.fleet import FleetEntry, FleetRegistry, RunnerState, runner_entry_id

if TYPE_CHECKING:
    from director.director import Director
    from director.drivers import DeploymentDriver
    from director.settings import DirectorSettings, Route

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class AdvertisedRunner:
    """What the director advertises in the fleet registry about its runner, fixed for its
    lifetime."""

    #: The runner's URL as api replicas reach it.
    url: str
    deployment: str
    version_id: str
    director: str
    #: Slots to advertise when the runner does not say (a stock Cog server's, whose
    #: ``concurrency.max`` the director's own ``--concurrency`` mirrors).
    concurrency: int

    @property
    def entry_id(self) -> str:
        return runner_entry_id(self.url)


class FleetMember:
    def __init__(
        self,
        registry: FleetRegistry,
        monitor: RunnerMonitor,
        advertised: AdvertisedRunner,
        stopping: asyncio.Event,
        interval: float,
    ) -> None:
        self.registry = registry
        self.monitor = monitor
        self.advertised = advertised
        self.stopping = stopping
        self.interval = interval
        self._registered = False

    def entry(self, now: float | None = None) -> FleetEntry:
        """The runner's entry as things stand."""
        capabilities = self.monitor.capabilities
        state = RunnerState.DRAINING if self.stopping.is_set() else self.monitor.state
        advertised = self.advertised
        return FleetEntry(
            id=advertised.entry_id,
            url=advertised.url,
            deployment=advertised.deployment,
            version_id=advertised.version_id,
            concurrency=capabilities.concurrency or advertised.concurrency,
            state=state,
            hardware=capabilities.hardware,
            heartbeat_at=time.time() if now is None else now,
            director=advertised.director,
            kind=capabilities.kind,
            runner_id=capabilities.id,
        )

    async def beat(self) -> None:
        entry = self.entry()
        if self._registered:
            await self.registry.heartbeat(entry)
        else:
            await self.registry.register(entry)
            self._registered = True

    async def run(self) -> None:
        """Write the entry every ``interval``, and at once when the director starts stopping
        (so it reads ``draining`` while in-flight predictions finish); until cancelled."""
        # Whatever a round meets, the next one comes: an entry no longer written drops the runner.
        beats = Periodic(
            "fleet-heartbeat",
            self.interval,
            self.beat,
            "fleet heartbeat",
            log,
            TRANSIENT,
            wake=self.stopping,
        )
        await beats.run(at_once=True)

    async def leave(self) -> None:
        """Delete the entry (the director is done); an outage leaves it to expire."""
        try:
            await self.registry.deregister(self.advertised.entry_id)
        except TRANSIENT as error:
            log.warning("fleet entry left to expire: %r", error)


def fleet_member(
    settings: DirectorSettings, director: Director, driver: DeploymentDriver, route: Route
) -> FleetMember:
    """Keeps one runner's fleet entry written while the director runs."""
    advertised = AdvertisedRunner(
        url=settings.fleet_url(route),
        deployment=driver.deployment.name,
        version_id=driver.deployment.version_id,
        director=director.consumer,
        concurrency=settings.concurrency,
    )
    return FleetMember(
        FleetRegistry(director.redis, settings.fleet_ttl_seconds),
        driver.monitor,
        advertised,
        director.stopping,
        settings.fleet_heartbeat_interval,
    )
