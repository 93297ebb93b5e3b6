"""What the director asks of its runner to watch it: its health check and what it can do
(:class:`RunnerProbes`, the runner client's reads that start nothing)."""

from __future__ import annotations

import logging
from typing import Any

import aiohttp

from core.unreachable import UNREACHABLE
from protocol.capabilities import STOCK_COG, Capabilities
from protocol.documents import HealthCheck
from protocol.paths import CAPABILITIES_PATH, HEALTH_CHECK_PATH
from protocol.session import RunnerSession

__all__ = ["RunnerProbes"]

log = logging.getLogger(__name__)
_HINT = "give the caller the runner's CONDUIT_RUNNER_TOKEN"
#: A capability answer whose body is not JSON.
_UNREADABLE: Any = object()


class RunnerProbes(RunnerSession):
    async def health_check(self) -> HealthCheck | None:
        """The runner's ``/health-check`` document; None when it cannot be had."""
        try:
            async with self.session.get(
                f"{self.base_url}{HEALTH_CHECK_PATH}",
                headers=self.auth,
                timeout=aiohttp.ClientTimeout(total=5),
                allow_redirects=False,
            ) as response:
                if response.status != 200:
                    return None
                return HealthCheck.model_validate(await response.json())
        except (*UNREACHABLE, ValueError):
            return None

    async def capabilities(self) -> Capabilities | None:
        """``GET /v1/capabilities``. ``STOCK_COG`` when the runner has no such route (404) or
        answers something unreadable; None when it cannot say yet (starting, unreachable)."""
        read = await self._read_capabilities()
        if read is None:
            return None
        status, body = read
        if status == 200:
            try:
                return Capabilities.from_json(body)
            except ValueError:
                return STOCK_COG
        if status in (404, 405):
            return STOCK_COG
        if status in (401, 403):
            log.warning("runner refused to say what it is (%d): %s", status, _HINT)
        return None

    async def capabilities_document(self) -> dict[str, Any] | None:
        """The capability document as the runner sent it (a pool host's lists its slots);
        None when it sent none."""
        read = await self._read_capabilities()
        if read is None or read[0] != 200 or not isinstance(read[1], dict):
            return None
        return read[1]

    async def _read_capabilities(self) -> tuple[int, Any] | None:
        """The status and JSON body of ``GET /v1/capabilities`` (``_UNREADABLE`` for a body
        that is not JSON); None when the runner cannot be reached."""
        try:
            async with self.session.get(
                f"{self.base_url}{CAPABILITIES_PATH}",
                headers=self.auth,
                timeout=aiohttp.ClientTimeout(total=5),
                allow_redirects=False,
            ) as response:
                if response.status != 200:
                    await response.read()
                    return response.status, None
                try:
                    return 200, await response.json(content_type=None)
                except ValueError:
                    return 200, _UNREADABLE
        except UNREACHABLE as error:
            log.debug("capabilities not read: %r", error)
            return None
