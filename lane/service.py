"""The synchronous lane of one api process, put together: the core in its shell, the fleet
view and replica membership that feed it runners, the HTTP session runners are called on (the
one runner client's, :mod:`protocol.client`), the recorder of finished runs and the work runs
leave behind. Built and started by the process that serves ``/run`` (the api's lifespan), which
hands it plain requests (:mod:`lane.request`); :mod:`lane.serving` takes each through.
"""

from __future__ import annotations

import socket
import uuid
from collections.abc import Callable

import aiohttp
from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine

from lane import serving
from lane.background import Background
from lane.core_records import LaneConfig, LaneCounters
from lane.errors import refusal
from lane.events import band_of
from lane.loans import Loans
from lane.membership import Membership
from lane.request import RunRequest, RunResult
from lane.run_recorder import SyncRecorder
from lane.settings import LaneSettings
from lane.shell import LaneShell
from lane.supply import LaneSupply
from protocol.client import RunnerClient
from protocol.values import Priority
from tracker.fleet import FleetEntry, FleetView


class Lane:
    def __init__(
        self,
        redis: Redis,
        engine: AsyncEngine,
        settings: LaneSettings,
        on_wait: Callable[[str, float], None] | None = None,
        config: LaneConfig | None = None,
    ) -> None:
        #: This replica's id among the lane's members: unique per process.
        self.replica_id = f"{socket.gethostname()}-{uuid.uuid4().hex[:12]}"
        self.loans = Loans(redis, self.replica_id, settings.lane_member_ttl)
        self.shell = LaneShell(config or settings.config(), on_wait, self.loans.repay)
        self.fleet = FleetView(redis, settings.lane_fleet_interval, self._fleet_changed)
        self.supply = LaneSupply(
            self.shell,
            lambda: self.fleet.entries,
            self.replica_id,
            refresh=settings.lane_refresh,
            interval=settings.lane_fleet_interval,
        )
        self.membership = Membership(
            redis,
            self.replica_id,
            self.supply.members_changed,
            settings.lane_member_heartbeat,
            settings.lane_member_ttl,
        )
        self.recorder = SyncRecorder(engine)
        #: What runs leave behind (cancels sent to runners), drained at stop.
        self.background = Background()
        self.token = settings.runner_token
        self._session: aiohttp.ClientSession | None = None
        self._clients: dict[str, RunnerClient] = {}

    def _fleet_changed(self, _: object) -> None:
        self.supply.fleet_changed()

    def client(self, entry: FleetEntry) -> RunnerClient:
        """The runner's client, on the lane's one session."""
        client = self._clients.get(entry.url)
        if client is None:
            if self._session is None:
                raise RuntimeError("the lane is not started")
            client = self._clients[entry.url] = RunnerClient(entry.url, self._session, self.token)
        return client

    def refuse_early(self, lane: str, account_id: int, priority: Priority) -> None:
        """Raise :class:`~lane.errors.OutOfCapacity` (or ``RunnerUnavailable``) when the lane
        would surely refuse a request now (no runner, the queue full, every runner out of
        service), before its body is read."""
        early = self.shell.refuse_early(lane, str(account_id), band_of(priority))
        if early is not None:
            raise refusal(early)

    async def run(self, request: RunRequest) -> RunResult:
        """Take one ``/run`` through the lane (:func:`lane.serving.run`)."""
        try:
            return await serving.run(self, request)
        finally:
            # A permit borrowed for it is back in Redis before the answer leaves.
            await self.loans.settled()

    async def start(self) -> None:
        # No cap on connections: the lane's permits bound the calls in flight.
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=30)
        self._session = aiohttp.ClientSession(connector=connector)
        await self.fleet.start()
        await self.membership.start()
        await self.supply.start()

    async def stop(self) -> None:
        await self.supply.stop()
        await self.membership.stop()
        await self.fleet.stop()
        self.shell.close()
        await self.loans.settled()
        await self.background.drain()
        await self.recorder.close()
        if self._session is not None:
            await self._session.close()

    # --- for the metrics ---------------------------------------------------------------------

    def snapshot(self) -> dict[str, LaneCounters]:
        return self.shell.snapshot()

    @property
    def records_written(self) -> int:
        return self.recorder.recorded

    @property
    def record_failures(self) -> int:
        return self.recorder.failures
