"""What serves a slot's model while it is loaded: a Cog-protocol server on a loopback port.

Both kinds start a server the pool proxies to, so a slot answers exactly as a single runner
of the same kind would:

- :class:`ConduitBackend`: a Conduit model in this process, served by the very app
  ``conduit runner <model>`` serves (:func:`runners.server.create_app`), on a port of its own
  and behind a token of its own that only the pool knows. Observed memory is what the model
  reports (:meth:`Model.memory_bytes`), else its declared size: a process RSS delta cannot be
  told apart from the other slots' loads in the same process. A CUDA model is given the GPU
  the pool placed it on as its ``device`` (``cuda:<k>``); on unload, what it left in PyTorch's
  cache goes back to the device.
- :class:`CogBackend`: a stock Cog server (``python -m cog.server.http``) as a subprocess in a
  session of its own, health-polled until ``READY``, confined to the GPUs the pool placed it on
  (``CUDA_VISIBLE_DEVICES``). Observed memory is what its process tree holds on those GPUs
  (NVML's per-process accounting; where NVML cannot see its processes, how much their used
  memory grew over the load), else the RSS of the tree (``/proc``).

The pool's core bounds a load by the model's ``load_timeout``: it cancels :meth:`start` and
calls :meth:`stop`, which must then undo a partial start.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import secrets
import signal
import sys
from collections.abc import Mapping, Sequence
from contextlib import suppress
from pathlib import Path
from typing import Any, Protocol

import aiohttp
from aiohttp import web

from core.ports import free_port
from core.unreachable import UNREACHABLE
from protocol.headers import bearer
from protocol.paths import HEALTH_CHECK_PATH, OPENAPI_PATH
from protocol.values import HealthStatus
from runners.config import RunnerConfig
from runners.model import Model
from runners.models import get_model
from runners.pool.config import MemoryProbe
from runners.pool.config_file import BackendFile
from runners.pool.nvml import cuda_ordinal, placement_env
from runners.server import create_app
from runners.service import RunnerService
from runners.state import SERVICE

log = logging.getLogger(__name__)

_POLL = 0.1
"""Seconds between health polls of a starting or busy Cog server."""
_STOP_GRACE = 10.0
_CONTEXT_BYTES = 64 * 1024 * 1024
"""Growth of a GPU's used memory below this is not taken for a model's (where NVML cannot
attribute memory to processes): a CUDA context alone takes several times more."""


class LoadError(Exception):
    """The backend could not start; the message says why (it becomes the slot's reason)."""


class Backend(Protocol):
    """A slot's server: started on a load, stopped on an unload."""

    device: str
    """``cpu`` or ``cuda``: where its memory lives (the capabilities list reports it)."""

    @property
    def url(self) -> str | None:
        """The running server's base URL; None while it is not running."""

    @property
    def headers(self) -> Mapping[str, str]:
        """Headers every proxied call carries (the server's own token)."""

    async def start(self, devices: tuple[int, ...]) -> int:
        """Start the server on ``devices`` (the GPUs the pool placed it on; empty: none) and
        wait until it serves; the bytes it observed taking. Raises :class:`LoadError`."""

    async def stop(self) -> None:
        """Stop the server and free its memory (also after a partial or failed start)."""

    async def settled(self, prediction_id: str) -> None:
        """Return once the prediction no longer runs (a ``respond-async`` one goes on after
        its response was answered; its permit is held until then)."""

    def openapi(self) -> dict[str, Any] | None:
        """The model's OpenAPI schema when known without a load."""


class ConduitBackend:
    def __init__(
        self,
        name: str,
        target: str,
        args: Mapping[str, Any],
        concurrency: int,
        declared_bytes: int,
        config: RunnerConfig,
    ) -> None:
        self.name = name
        self._class = get_model(target)
        self._args = dict(args)
        self._concurrency = concurrency
        self._declared = declared_bytes
        self._config = config
        template = self._class(**self._args)  # cheap: the weights load in setup()
        self._schema = template.openapi_schema()
        self.device = "cuda" if template.device.startswith("cuda") else "cpu"
        self._runner: web.AppRunner | None = None
        self._service: RunnerService | None = None
        self._url: str | None = None
        self._token = secrets.token_urlsafe(32)

    @property
    def url(self) -> str | None:
        return self._url

    @property
    def headers(self) -> Mapping[str, str]:
        return bearer(self._token)

    @property
    def service(self) -> RunnerService | None:
        """The running runner service (its caches, for a flush); None while unloaded."""
        return self._service if self._url is not None else None

    def openapi(self) -> dict[str, Any] | None:
        return self._schema

    async def start(self, devices: tuple[int, ...]) -> int:
        model: Model = self._class(**self._args)
        if devices and model.device.startswith("cuda"):
            model.device = f"cuda:{cuda_ordinal(devices[0])}"
        self.device = "cuda" if model.device.startswith("cuda") else "cpu"
        runner_id = f"{self._config.runner_id or 'pool'}/{self.name}"
        config = self._config.model_copy(update={"token": self._token, "runner_id": runner_id})
        app = create_app(model, self._concurrency, config)
        self._service = app[SERVICE]
        self._runner = web.AppRunner(
            app, handler_cancellation=True, handle_signals=False, access_log=None
        )
        await self._runner.setup()  # starts the model's setup in the background
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        host, port = self._runner.addresses[0][:2]
        if not await self._service.wait_ready():
            logs = self._service.lifecycle.setup_result.get("logs", "").strip()
            raise LoadError(logs.splitlines()[-1] if logs else "setup failed")
        self._url = f"http://{host}:{port}"
        return model.memory_bytes() or self._declared

    async def stop(self) -> None:
        self._url = None
        service, runner = self._service, self._runner
        self._service = self._runner = None
        if service is not None and service.ready:
            await service.lifecycle.unload()
        if runner is not None:
            await runner.cleanup()
        release_cuda_cache()

    async def settled(self, prediction_id: str) -> None:
        service = self._service
        prediction = None if service is None else service.get(prediction_id)
        if prediction is not None:
            await prediction.wait()


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


def release_cuda_cache() -> None:
    """Give back to the device what unloaded models left in PyTorch's caching allocator; else
    NVML counts it as this process's for good (only where a model already brought torch in)."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return
    gc.collect()  # an unloaded model's tensors may still be held in reference cycles
    torch.cuda.empty_cache()


def build(
    name: str,
    spec: BackendFile,
    concurrency: int,
    declared_bytes: int,
    config: RunnerConfig,
    session: aiohttp.ClientSession,
    probe: MemoryProbe,
) -> Backend:
    if spec.conduit is not None:
        return ConduitBackend(name, spec.conduit, spec.args, concurrency, declared_bytes, config)
    assert spec.cog is not None
    cog = spec.cog
    return CogBackend(name, cog.command, cog.cwd, cog.environment(), session, probe)


# --- memory -----------------------------------------------------------------------------------


def rss(pid: int) -> int:
    """A process's resident set in bytes (``VmRSS``); 0 when it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _children(pid: int) -> list[int]:
    found: list[int] = []
    with suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with suppress(OSError, ValueError):
                found += [int(c) for c in (task / "children").read_text().split()]
    return found


def tree_pids(pid: int) -> list[int]:
    """A process and all its descendants (Cog's server runs its model in a child)."""
    found: list[int] = []
    todo = [pid]
    while todo:
        current = todo.pop()
        if current in found:
            continue
        found.append(current)
        todo += _children(current)
    return found


def tree_rss(pid: int) -> int:
    """RSS of a process and all its descendants."""
    return sum(rss(current) for current in tree_pids(pid))
