"""Cog's runner HTTP API (coglet 0.23.1 on the wire), as a thin aiohttp shell: the app
(:func:`create_app`) and how it is served (:func:`run_app`, :func:`serve`).

The route handlers are in :mod:`runners.cog_routes`, the logic in
:class:`runners.service.RunnerService`, the control API in :mod:`runners.control`, who may call
what in :mod:`runners.auth`.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable, Mapping
from typing import Any

from aiohttp import web
from aiohttp.log import access_logger

from core.logs import configure_unless_configured
from protocol.paths import (
    CANCEL_PATH,
    HEALTH_CHECK_PATH,
    OPENAPI_PATH,
    PREDICTION_PATH,
    PREDICTIONS_PATH,
    ROOT_PATH,
    SHUTDOWN_PATH,
)
from runners.auth import is_loopback_host
from runners.cog_routes import (
    cancel_prediction,
    create_prediction,
    create_prediction_idempotent,
    health_check,
    openapi_schema,
    root,
    shutdown,
)
from runners.config import RunnerConfig
from runners.control import CONTROL_PLANE, control_app
from runners.metrics import RunnerMetrics
from runners.model import Model
from runners.models import get_model
from runners.runner_plane import RunnerControlPlane
from runners.service import RunnerService
from runners.state import SERVICE

__all__ = ["SERVICE", "create_app", "run_app", "serve"]

log = logging.getLogger(__name__)


def create_app(
    model: Model, concurrency: int, config: RunnerConfig | None = None
) -> web.Application:
    """The runner app for ``model`` with ``concurrency`` slots.

    Serve it with ``handler_cancellation=True`` (as :func:`serve` and aiohttp's test server
    do) so that a sync client hanging up cancels its prediction, and ``auto_decompress=False``
    (as :func:`run_app` does) so that no request body is inflated. ``POST /shutdown`` only sets
    ``app[SERVICE].shutdown_requested``; whoever runs the app decides what stopping means.
    With ``config.token`` set, every route but the health checks needs it (:mod:`runners.auth`);
    without, the internal calls are refused unless ``config.trust_loopback``. A body sent with
    a ``Content-Encoding`` is refused unread (:mod:`runners.encoding`).
    """
    config = config or RunnerConfig.from_env()
    service = RunnerService(model, concurrency, config, RunnerMetrics())
    app = control_app(config)
    app[SERVICE] = service
    app[CONTROL_PLANE] = RunnerControlPlane(service)

    async def on_startup(_: web.Application) -> None:
        await service.start()

    async def on_shutdown(_: web.Application) -> None:
        await service.stop()

    app.on_startup.append(on_startup)
    app.on_shutdown.append(on_shutdown)
    app.router.add_get(ROOT_PATH, root)
    app.router.add_get(HEALTH_CHECK_PATH, health_check)
    app.router.add_get(OPENAPI_PATH, openapi_schema)
    app.router.add_post(PREDICTIONS_PATH, create_prediction)
    app.router.add_put(PREDICTION_PATH, create_prediction_idempotent)
    app.router.add_post(CANCEL_PATH, cancel_prediction)
    app.router.add_post(SHUTDOWN_PATH, shutdown)
    return app


async def run_app(app: web.Application, host: str, port: int) -> None:
    """Serve ``app`` until SIGTERM, SIGINT or ``POST /shutdown``, then stop gracefully:
    stop accepting, let in-flight predictions finish within the grace period, return."""
    service = app[SERVICE]
    runner = web.AppRunner(
        app,
        handler_cancellation=True,
        handle_signals=False,
        shutdown_timeout=5.0,
        access_log=access_logger if service.config.access_log else None,
        # Bodies reach the app as sent: an encoded one is refused, never inflated (even while
        # the refusal drains it).
        auto_decompress=False,
    )
    await runner.setup()
    loop = asyncio.get_running_loop()
    try:
        await web.TCPSite(runner, host, port).start()
        for address in runner.addresses:
            log.info("runner for %s listening on %s:%s", service.model.name, *address[:2])
        config = service.config
        if config.token is None and not is_loopback_host(host):
            log.warning(
                "listening on %s without CONDUIT_RUNNER_TOKEN: whoever reaches this port may "
                "run predictions",
                host,
            )
        if config.token is None:
            log.warning(
                "without CONDUIT_RUNNER_TOKEN, shutdown, cancel and attach are refused %s: "
                "give the runner and its director the same token",
                "to all but loopback" if config.trust_loopback else "to everyone",
            )
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, service.shutdown_requested.set)
        await service.shutdown_requested.wait()
        log.info("shutting down")
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
        await runner.cleanup()


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    try:
        import uvloop
    except ImportError:
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def serve(
    model_name: str,
    host: str,
    port: int,
    concurrency: int,
    model_args: Mapping[str, Any] | None = None,
) -> None:
    """Run the named model's runner in this process until it is told to stop.

    ``model_args`` are keyword arguments for the model's constructor (e.g. ``model=`` for
    ``vllm``, the weights to serve).
    """
    configure_unless_configured()
    app = create_app(get_model(model_name)(**(model_args or {})), concurrency)
    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        runner.run(run_app(app, host, port))
