"""The director's liveness and readiness, answered by its receiver (``/livez``, ``/readyz``).

- Live: the main loop turns. It turns at least every ``block_ms`` (reading the queue, or
  waiting for a free worker) and every few seconds while Redis is away; a loop that has not
  turned for ``loop_stall_after`` seconds is stuck, and a restart is the cure. No backend is
  asked: a director restarted because Postgres is away would only come back to the same.
  While it stops (SIGTERM, finishing in-flight predictions) it stays live.
- Ready: Redis, Postgres and its runner's ``/health`` answer (every runner's, or the pool
  host's, when it serves several deployments), and it is not stopping.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
from redis.asyncio import Redis
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from director.director import Director
from protocol.paths import HEALTH_PATH

#: Seconds each backend gets to answer a readiness probe: under kubelet's usual 3 s timeout.
CHECK_TIMEOUT = 2.0
OK = "ok"


def _error(error: BaseException) -> str:
    return f"error: {type(error).__name__}"


class Probes:
    def __init__(
        self,
        director: Director,
        engine: AsyncEngine,
        redis: Redis,
        session: aiohttp.ClientSession,
        runner_urls: list[str],
        stall_after: float,
    ) -> None:
        """``runner_urls``: the base URLs whose ``/health`` must answer 200."""
        self.director = director
        self.engine = engine
        self.redis = redis
        self.session = session
        self.runner_urls = runner_urls
        self.stall_after = stall_after

    def live(self) -> tuple[bool, dict[str, Any]]:
        if self.director.stopping.is_set():
            return True, {"loop": "stopping"}
        last = self.director.last_turn
        if last is None:
            return True, {"loop": "starting"}
        idle = asyncio.get_running_loop().time() - last
        if idle > self.stall_after:
            return False, {"loop": f"no turn for {idle:.1f}s (limit {self.stall_after:g}s)"}
        return True, {"loop": OK}

    async def ready(self) -> tuple[bool, dict[str, Any]]:
        redis, database, runner = await asyncio.gather(
            self._redis(), self._database(), self._runner()
        )
        checks = {
            "redis": redis,
            "database": database,
            "runner": runner,
            "accepting": "stopping" if self.director.stopping.is_set() else OK,
        }
        return all(value == OK for value in checks.values()), checks

    async def _redis(self) -> str:
        try:
            async with asyncio.timeout(CHECK_TIMEOUT):
                await self.redis.ping()
            return OK
        except Exception as error:  # any failure means not ready; the kind is reported
            return _error(error)

    async def _database(self) -> str:
        try:
            async with asyncio.timeout(CHECK_TIMEOUT):
                async with self.engine.connect() as conn:
                    await conn.execute(text("SELECT 1"))
            return OK
        except Exception as error:
            return _error(error)

    async def _runner(self) -> str:
        """Each runner's ``/health``: 200 once its model is loaded and while it is well."""
        answers = await asyncio.gather(*(self._health(url) for url in self.runner_urls))
        return next((answer for answer in answers if answer != OK), OK)

    async def _health(self, base_url: str) -> str:
        try:
            async with self.session.get(
                f"{base_url}{HEALTH_PATH}",
                timeout=aiohttp.ClientTimeout(total=CHECK_TIMEOUT),
                allow_redirects=False,
            ) as response:
                await response.read()
                return OK if response.status == 200 else f"error: HTTP {response.status}"
        except Exception as error:
            return _error(error)
