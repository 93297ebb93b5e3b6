"""The one way a process keeps Prometheus metrics: an object per process with a registry of its
own, built by the process's composition root and handed to the parts that count.

No module holds a registry or a metric: two processes' worth of parts in one interpreter (the
suite runs an api, a director and runners side by side) count apart, and nothing registers
twice. Each process's metrics (``ApiMetrics``, ``DirectorMetrics``, ``RunnerMetrics``,
``PoolMetrics``) is one of these; figures read from live objects at each scrape are collectors
registered on its registry.
"""

from __future__ import annotations

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.registry import Collector


class ProcessMetrics:
    """A registry of one process's own, and its text exposition."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()

    def register(self, collector: Collector) -> None:
        """Add figures read at each scrape."""
        self.registry.register(collector)

    def exposition(self) -> bytes:
        """The registry in Prometheus' text format."""
        return generate_latest(self.registry)


class MetricsServer:
    """``/metrics`` alone on a port of its own, in the process's event loop."""

    def __init__(self, metrics: ProcessMetrics, host: str, port: int) -> None:
        self.metrics = metrics
        self.host = host
        self.port = port
        self._runner: web.AppRunner | None = None

    async def _serve(self, request: web.Request) -> web.Response:
        return web.Response(
            body=self.metrics.exposition(), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/metrics", self._serve)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
