"""What a director writes in its runner's fleet entry, from what its monitor knows (no I/O:
the monitor's view is set as its checks would set it)."""

from __future__ import annotations

import asyncio

import pytest

from director.fleet_member import AdvertisedRunner, FleetMember
from director.runner_monitor import RunnerMonitor
from protocol.capabilities import STOCK_COG, Capabilities
from protocol.client import RunnerClient
from protocol.values import HealthStatus
from tracker.fleet import RunnerState

ADVERTISED = AdvertisedRunner(
    url="http://runner.internal:5000",
    deployment="acme/echo",
    version_id="v" * 64,
    director="d-1",
    concurrency=2,
)


def _member(status: HealthStatus, capabilities: Capabilities = STOCK_COG) -> FleetMember:
    # The client is never called here: the monitor's view is set directly.
    monitor = RunnerMonitor(RunnerClient("http://127.0.0.1:1", None), 1.0, 3)  # type: ignore[arg-type]
    monitor.status = status
    monitor.capabilities = capabilities
    return FleetMember(None, monitor, ADVERTISED, asyncio.Event(), 1.0)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("status", "state"),
    [
        (HealthStatus.READY, RunnerState.READY),
        (HealthStatus.BUSY, RunnerState.READY),
        (HealthStatus.STARTING, RunnerState.LOADING),
        (HealthStatus.UNKNOWN, RunnerState.LOADING),
        (HealthStatus.SETUP_FAILED, RunnerState.UNHEALTHY),
        (HealthStatus.DEFUNCT, RunnerState.UNHEALTHY),
        (HealthStatus.UNHEALTHY, RunnerState.UNHEALTHY),
    ],
)
def test_the_state_follows_the_runners_health(status: HealthStatus, state: RunnerState) -> None:
    assert _member(status).entry(now=1.0).state is state


def test_a_gone_runner_is_unhealthy_and_a_stopping_director_drains() -> None:
    member = _member(HealthStatus.READY)
    member.monitor._gone = True
    assert member.entry().state is RunnerState.UNHEALTHY
    member.monitor._gone = False
    member.stopping.set()
    assert member.entry().state is RunnerState.DRAINING


def test_a_stock_cog_runner_advertises_the_directors_concurrency() -> None:
    entry = _member(HealthStatus.READY).entry(now=5.0)
    assert (entry.kind, entry.concurrency, entry.runner_id) == ("cog", 2, None)
    assert entry.hardware == STOCK_COG.hardware
    assert (entry.url, entry.deployment, entry.director) == (ADVERTISED.url, "acme/echo", "d-1")
    assert entry.id == ADVERTISED.entry_id
    assert entry.heartbeat_at == 5.0


def test_a_conduit_runner_advertises_its_own_slots() -> None:
    said = Capabilities.from_json(
        {"runnerType": "conduit-echo", "runnerId": "r-7", "hardware": "gpu", "queue": {"slots": 6}}
    )
    entry = _member(HealthStatus.READY, said).entry()
    assert (entry.kind, entry.concurrency, entry.runner_id, entry.hardware) == (
        "conduit-echo",
        6,
        "r-7",
        "gpu",
    )


@pytest.mark.parametrize("slots", [0, -1, True, "4", None])
def test_slots_that_are_not_a_positive_count_say_nothing(slots: object) -> None:
    said = Capabilities.from_json({"runnerType": "conduit-echo", "queue": {"slots": slots}})
    assert said.concurrency is None
