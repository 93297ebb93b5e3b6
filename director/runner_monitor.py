"""Watches the runner for the two ways it can lose the predictions it was running: it stops
answering, or it restarts (its ``setup.started_at`` changes; Cog's runners keep nothing across
a restart). Either bumps ``generation``; an execution that began under an older generation
knows its prediction is gone and leaves the entry to the queue's retry.

It also reads what the runner says about itself (``GET /v1/capabilities``: its hardware, for
usage records, and its slots, for the fleet registry) when it first answers and again whenever
it comes back or restarts; a stock Cog server has no such route and counts as unknown hardware
(its slots are the director's ``--concurrency``).
"""

from __future__ import annotations

import logging

from core.periodic import Periodic
from protocol.capabilities import STOCK_COG, Capabilities
from protocol.client import RunnerClient
from protocol.values import HealthStatus
from tracker.fleet import RunnerState

log = logging.getLogger(__name__)

#: The fleet state of each ``/health-check`` status (a runner not yet heard from is loading).
_FLEET_STATES = {
    HealthStatus.READY: RunnerState.READY,
    HealthStatus.BUSY: RunnerState.READY,
    HealthStatus.STARTING: RunnerState.LOADING,
    HealthStatus.UNKNOWN: RunnerState.LOADING,
}


class RunnerMonitor:
    def __init__(self, runner: RunnerClient, interval: float, failures_to_gone: int) -> None:
        self.runner = runner
        self.interval = interval
        self.failures_to_gone = failures_to_gone
        self.generation = 0
        self.status = HealthStatus.UNKNOWN
        self._started_at: str | None = None
        self._failures = 0
        self._gone = False
        self.capabilities: Capabilities = STOCK_COG
        #: The generation whose capabilities were read; None before the first read.
        self._capabilities_of: int | None = None

    @property
    def hardware(self) -> str:
        return self.capabilities.hardware

    @property
    def state(self) -> RunnerState:
        """The runner's state as the fleet registry says it: unhealthy once gone, or when its
        setup failed or it is defunct; loading until it answers ready."""
        if self._gone:
            return RunnerState.UNHEALTHY
        return _FLEET_STATES.get(self.status, RunnerState.UNHEALTHY)

    @property
    def gone(self) -> bool:
        """Unreachable for ``failures_to_gone`` checks in a row."""
        return self._gone

    async def check(self) -> None:
        health = await self.runner.health_check()
        if health is None:
            self._failures += 1
            self.status = HealthStatus.UNKNOWN
            if self._failures >= self.failures_to_gone and not self._gone:
                log.warning(
                    "runner unreachable for %d checks: its predictions are lost", self._failures
                )
                self._gone = True
                self.generation += 1
            return
        self._failures = 0
        self.status = health.status
        started_at = health.setup.started_at if health.setup else None
        if self._gone or (self._started_at and started_at and started_at != self._started_at):
            if not self._gone:
                log.warning("runner restarted: the predictions it was running are lost")
                self.generation += 1
            self._gone = False
        self._started_at = started_at or self._started_at
        if self._capabilities_of != self.generation:
            await self._read_capabilities()

    async def _read_capabilities(self) -> None:
        capabilities = await self.runner.capabilities()
        if capabilities is None:
            return  # starting, or gone again: the next check asks again
        if capabilities != self.capabilities or self._capabilities_of is None:
            log.info(
                "runner is %s%s on %s hardware",
                capabilities.kind,
                f" {capabilities.id}" if capabilities.id else "",
                capabilities.hardware,
            )
        self.capabilities = capabilities
        self._capabilities_of = self.generation

    async def run_forever(self) -> None:
        """Check every ``interval``; the caller makes the first ``check()`` itself."""
        await Periodic("runner-monitor", self.interval, self.check, "runner check", log).run()
