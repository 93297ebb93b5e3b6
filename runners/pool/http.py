"""``conduit runner pool``: the pool host's app, put together, and its serving loop.

The host is built on the same frame as a single runner (:func:`runners.control.control_app`):
refusals as problem+json, the runner token (``CONDUIT_RUNNER_TOKEN``) on every route but the
health checks (:mod:`runners.auth`), encoded bodies refused, and the control API at the root,
served for every slot by :class:`runners.pool.plane.PoolControlPlane` with the same bodies and
operation tokens. Each slot is a Cog runner under ``/models/<name>/``
(:mod:`runners.pool.slot_routes`). The slots' backends, the core and its host are built when
the app starts, and stopped when it is cleaned up.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket

import aiohttp
import orjson
from aiohttp import web

from core.logs import configure_unless_configured
from protocol.headers import JSON
from protocol.paths import (
    CAPABILITIES_PATH,
    HEALTH_CHECK_PATH,
    PROBE_PATHS,
    ROOT_PATH,
    SHUTDOWN_PATH,
)
from protocol.values import HealthStatus
from runners import COG_VERSION
from runners.auth import TOKEN_REQUIRED, is_loopback_host, require_internal
from runners.config import RunnerConfig
from runners.control import CONTROL_PLANE, control_app
from runners.control_plane import op_token_verifier
from runners.pool.backend_factory import build
from runners.pool.config import FixedProbe, MemoryProbe, PoolConfigError
from runners.pool.config_file import PoolFile, load
from runners.pool.core import PoolCore
from runners.pool.host import PoolHost
from runners.pool.metrics import PoolMetrics
from runners.pool.nvml import SystemProbe
from runners.pool.plane import PoolControlPlane
from runners.pool.slot_routes import PROBES, add_slot_routes
from runners.pool.state import POOL, PROBE, Pool

__all__ = ["create_app", "run", "serve"]

log = logging.getLogger(__name__)


def _json(body: dict[str, object]) -> web.Response:
    return web.Response(body=orjson.dumps(body), content_type=JSON)


async def root(request: web.Request) -> web.Response:
    pool = request.app[POOL]
    return _json(
        {
            "cog_version": COG_VERSION,
            "models": {m.name: f"/models/{m.name}" for m in pool.file.models},
            "capabilities_url": CAPABILITIES_PATH,
            "healthcheck_url": HEALTH_CHECK_PATH,
        }
    )


async def root_health_check(request: web.Request) -> web.Response:
    pool = request.app[POOL]
    status = "UNHEALTHY" if pool.host.closing else HealthStatus.READY.value
    return _json({"status": status, "models": [m.name for m in pool.file.models]})


async def shutdown(request: web.Request) -> web.Response:
    require_internal(request, "shutdown")
    request.app[POOL].shutdown.set()
    return _json({})


def _probe(file: PoolFile) -> MemoryProbe:
    """NVML's GPUs, read live, unless a budget is given without ``device: gpu`` (then one
    device of that budget, as on a CPU host)."""
    if file.budget is not None and file.device != "gpu":
        return FixedProbe((file.budget,))
    return SystemProbe(file.device)


def create_app(
    file: PoolFile, config: RunnerConfig | None = None, probe: MemoryProbe | None = None
) -> web.Application:
    """The pool's app; its slots' backends are built and the core started on startup."""
    config = config or RunnerConfig.from_env()
    app = control_app(config, PROBE_PATHS | PROBES)

    async def on_startup(app: web.Application) -> None:
        session = aiohttp.ClientSession(auto_decompress=False)
        runner_id = config.runner_id or f"{socket.gethostname()}:{os.getpid()}"
        memory = app[PROBE] = probe or _probe(file)
        backends = {
            m.name: build(m.name, m.backend, m.concurrency, m.size, config, session, memory)
            for m in file.models
        }
        host = PoolHost(PoolCore(file.pool_config(), memory), backends)
        pool = app[POOL] = Pool(
            file, host, session, runner_id, op_token_verifier(config, runner_id)
        )
        app[CONTROL_PLANE] = PoolControlPlane(pool, PoolMetrics(pool))
        host.start()

    async def on_cleanup(app: web.Application) -> None:
        pool = app[POOL]
        for task in list(pool.tasks):
            task.cancel()
        await pool.host.close()
        await pool.session.close()
        if pool.op_tokens is not None:
            await pool.op_tokens.nonces.aclose()
        if isinstance(memory := app[PROBE], SystemProbe):
            memory.close()

    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    app.router.add_get(ROOT_PATH, root)
    app.router.add_get(HEALTH_CHECK_PATH, root_health_check)
    app.router.add_post(SHUTDOWN_PATH, shutdown)
    add_slot_routes(app)
    return app


async def run(app: web.Application, host: str, port: int) -> None:
    """Serve until SIGTERM, SIGINT or ``POST /shutdown``; then stop every backend."""
    # Bodies as sent: an encoded one is refused (runners.encoding), never inflated.
    runner = web.AppRunner(
        app, handler_cancellation=True, handle_signals=False, auto_decompress=False
    )
    await runner.setup()
    loop = asyncio.get_running_loop()
    stop = app[POOL].shutdown
    try:
        await web.TCPSite(runner, host, port).start()
        log.info("model pool listening on %s:%s", host, port)
        if not app[TOKEN_REQUIRED] and not is_loopback_host(host):
            log.warning("listening on %s without CONDUIT_RUNNER_TOKEN", host)
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        await stop.wait()
        log.info("shutting down")
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
        await runner.cleanup()


def serve(config_path: str, host: str, port: int) -> None:
    configure_unless_configured()
    file = load(config_path)
    probe = _probe(file)
    try:  # a configuration the core refuses (pins over the budget) stops here, not mid-start
        PoolCore(file.pool_config(), probe)
    except PoolConfigError as error:  # NoDeviceError too: device: gpu, and NVML finds none
        raise SystemExit(f"conduit runner pool: {error}") from None
    finally:
        if isinstance(probe, SystemProbe):
            probe.close()
    asyncio.run(run(create_app(file), host, port))
