"""The synchronous lane of one api process, put together: the core in its shell, the fleet
view and replica membership that feed it runners, the HTTP session runners are called on, and
the recorder of finished runs. Built and started in the app's lifespan; the ``/run`` routes
(``api.routes.run``) use it.
"""

from __future__ import annotations

import socket
import uuid
from collections.abc import Callable

import aiohttp
from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine

from api.lane.core import LaneConfig, LaneCounters
from api.lane.membership import Membership
from api.lane.record import SyncRecorder
from api.lane.shell import LaneShell
from api.lane.supply import LaneSupply
from api.settings import ApiSettings
from director.runner_client import RunnerClient
from tracker.fleet import FleetEntry, FleetView


def config_from(settings: ApiSettings) -> LaneConfig:
    return LaneConfig(queue_factor=settings.lane_queue_factor, queue_ttl_s=settings.lane_queue_ttl)


class Lane:
    def __init__(
        self,
        redis: Redis,
        engine: AsyncEngine,
        settings: ApiSettings,
        on_wait: Callable[[str, float], None] | None = None,
        config: LaneConfig | None = None,
    ) -> None:
        #: This replica's id among the lane's members: unique per process.
        self.replica_id = f"{socket.gethostname()}-{uuid.uuid4().hex[:12]}"
        self.shell = LaneShell(config or config_from(settings), on_wait)
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
