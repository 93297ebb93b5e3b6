"""A slot's backend for a stock Cog server (``python -m cog.server.http``): a subprocess in a
session of its own, health-polled until ``READY``, confined to the GPUs the pool placed it on
(``CUDA_VISIBLE_DEVICES``).

Observed memory is what its process tree holds on those GPUs (NVML's per-process accounting;
where NVML cannot see its processes, how much their used memory grew over the load), else the
RSS of the tree (``/proc``, :mod:`runners.pool.proc_memory`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from collections.abc import Mapping, Sequence
from contextlib import suppress
from pathlib import Path
from typing import Any

import aiohttp

from core.ports import free_port
from core.unreachable import UNREACHABLE
from protocol.paths import HEALTH_CHECK_PATH, OPENAPI_PATH
from protocol.values import HealthStatus
from runners.pool.backends import LoadError
from runners.pool.config import MemoryProbe
from runners.pool.nvml import placement_env
from runners.pool.proc_memory import tree_pids, tree_rss

log = logging.getLogger(__name__)

_POLL = 0.1
"""Seconds between health polls of a starting or busy Cog server."""
_STOP_GRACE = 10.0
_CONTEXT_BYTES = 64 * 1024 * 1024
"""Growth of a GPU's used memory below this is not taken for a model's (where NVML cannot
attribute memory to processes): a CUDA context alone takes several times more."""


class CogBackend:
    """A stock Cog server: ``command`` (default ``python -m cog.server.http --host 127.0.0.1``
    with this interpreter) in ``cwd``, its port in ``PORT`` and in any ``{port}`` argument."""

    def __init__(
        self,
        name: str,
        command: Sequence[str] | None,
        cwd: str | None,
        env: Mapping[str, str],
        session: aiohttp.ClientSession,
        probe: MemoryProbe,
    ) -> None:
        self.name = name
        self._command = list(command or [sys.executable, "-m", "cog.server.http"])
        if command is None:
            self._command += ["--host", "127.0.0.1"]
        self._cwd = cwd
        self._env = dict(env)
        self._session = session
        self._probe = probe
        self.device = "cpu"
        self._placed: tuple[int, ...] = ()
        """The GPUs it was started on (a stop waits for their memory to be free)."""
        self._proc: asyncio.subprocess.Process | None = None
        self._url: str | None = None
        self._schema: dict[str, Any] | None = None

    @property
    def url(self) -> str | None:
        return self._url

    @property
    def headers(self) -> Mapping[str, str]:
        return {}

    def openapi(self) -> dict[str, Any] | None:
        return self._schema

    async def start(self, devices: tuple[int, ...]) -> int:
        port = free_port()
        bindir = str(Path(sys.executable).parent)
        env = {
            **os.environ,
            # coglet starts its worker as `python` from PATH: this interpreter's must come first
            "PATH": f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}",
            "PORT": str(port),
            **self._env,
            **placement_env(devices),  # the pool's placement is what its accounting assumes
        }
        before = await asyncio.to_thread(self._used, devices)
        self._placed = devices
        args = [part.replace("{port}", str(port)) for part in self._command]
        try:
            self._proc = await asyncio.create_subprocess_exec(
                *args, cwd=self._cwd, env=env, start_new_session=True
            )
        except OSError as error:
            raise LoadError(f"cannot start {args[0]}: {error}") from error
        url = f"http://127.0.0.1:{port}"
        while (status := _status(body := await self._health(url))) != HealthStatus.READY:
            if self._proc.returncode is not None:
                raise LoadError(f"cog server exited with {self._proc.returncode}")
            if status == HealthStatus.SETUP_FAILED:
                raise LoadError(f"cog server setup failed{_last_log_line(body)}")
            await asyncio.sleep(_POLL)
        async with self._session.get(url + OPENAPI_PATH) as response:
            self._schema = await response.json(content_type=None)
        self._url = url
        return await asyncio.to_thread(self._observe, self._proc.pid, devices, before)

    def _used(self, devices: tuple[int, ...]) -> int:
        """Bytes in use on ``devices`` by every process (0 off a GPU)."""
        if not devices:
            return 0
        return sum(
            d.total_bytes - d.free_bytes for d in self._probe.devices() if d.index in devices
        )

    def _observe(self, pid: int, devices: tuple[int, ...], before: int) -> int:
        """What the server took: its tree's memory on the GPUs, else its RSS (on the CPU)."""
        pids = tree_pids(pid)
        held = sum(self._probe.process_memory(pids).values())
        if not held and devices:  # NVML cannot see its processes: the growth is the best guess
            grown = self._used(devices) - before
            held = grown if grown >= _CONTEXT_BYTES else 0
        self.device = "cuda" if held else "cpu"
        return held or tree_rss(pid)

    async def _health(self, url: str) -> dict[str, Any] | None:
        try:
            async with self._session.get(
                url + HEALTH_CHECK_PATH, timeout=aiohttp.ClientTimeout(total=2)
            ) as response:
                body = await response.json(content_type=None)
        except (*UNREACHABLE, ValueError):  # no answer, or not JSON
            return None
        return body if isinstance(body, dict) else None

    async def stop(self) -> None:
        self._url = None
        proc, self._proc = self._proc, None
        placed, self._placed = self._placed, ()
        pids: list[int] = []
        if proc is not None and proc.returncode is None:
            pids = tree_pids(proc.pid) if placed else []
            with suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), _STOP_GRACE)
            except TimeoutError:
                with suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                await proc.wait()
        await self._freed(pids)

    async def _freed(self, pids: list[int]) -> None:
        """Return once the GPUs no longer count memory to ``pids`` (a worker may outlive the
        server by a moment), so the next load decision reads the device without them."""
        loop = asyncio.get_running_loop()
        until = loop.time() + _STOP_GRACE
        while pids:
            if not await asyncio.to_thread(self._probe.process_memory, pids):
                return
            if loop.time() >= until:
                log.warning("%s: its GPU memory is still in use after it stopped", self.name)
                return
            await asyncio.sleep(_POLL)

    async def settled(self, prediction_id: str) -> None:
        """Stock Cog has no way to ask about one prediction: wait until it is no longer
        ``BUSY`` (exact with its default concurrency of 1, conservative above)."""
        url = self._url
        while url is not None and _status(await self._health(url)) == HealthStatus.BUSY:
            await asyncio.sleep(_POLL)
            url = self._url


def _status(health: dict[str, Any] | None) -> str | None:
    status = None if health is None else health.get("status")
    return status if isinstance(status, str) else None


def _last_log_line(health: dict[str, Any] | None) -> str:
    """``: <the last line of its setup logs>`` (a traceback's last line names the error)."""
    setup = None if health is None else health.get("setup")
    logs = setup.get("logs") if isinstance(setup, dict) else None
    lines = logs.strip().splitlines() if isinstance(logs, str) else []
    return f": {lines[-1].strip()}" if lines else ""
