"""Prometheus metrics of one api process, on its own registry (``/metrics``).

Requests are counted by method, route template (``/v1/predictions/{prediction_id}``, never
the path itself, so ids do not become label values) and status, with a latency histogram by
route; paths that match no route count as ``unmatched``. Gauges read at scrape time: waiters
held by the event hub (``Prefer: wait`` and SSE), and the use of the Postgres and Redis pools.

The registry belongs to the app (``create_app`` makes one), not to the module: two apps in one
process (tests) count apart, and nothing registers twice.

``/metrics`` is on the API's port unless ``CONDUIT_API_METRICS_PORT`` is set; then it is only
on that port (:class:`MetricsServer`), and the API's port answers it 404 like any unknown path.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from fastapi import APIRouter, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.deps import Resources
from api.errors import NotFound
from core.metrics import MetricsServer, ProcessMetrics
from lane.metrics import LaneCollector, LaneWait

__all__ = ["ApiMetrics", "MetricsServer"]

#: Latency buckets (s): the API's own answers take milliseconds; ``Prefer: wait`` up to 60 s.
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
UNMATCHED = "unmatched"


class ApiMetrics(ProcessMetrics):
    def __init__(self) -> None:
        super().__init__()
        self.requests = Counter(
            "conduit_api_requests",
            "HTTP requests answered, by method, route template and status.",
            ["method", "route", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "conduit_api_request_duration_seconds",
            "Seconds from a request's arrival to the end of its answer, by route template.",
            ["method", "route"],
            buckets=BUCKETS,
            registry=self.registry,
        )
        #: ``lane_queue_wait_seconds``, observed by the synchronous lane at each dispatch.
        self.lane_wait = LaneWait(self.registry)
        #: Each (method, route, status)'s counter and histogram children: ``labels()`` checks
        #: and locks on every call, a measurable part of a fast request. Routes are templates
        #: and statuses few, so this stays small.
        self._children: dict[tuple[str, str, int], tuple[Counter, Histogram]] = {}

    def watch(self, resources: Callable[[], Resources | None]) -> None:
        """Report the waiters, pools and lane of the resources the app opened (none before)."""
        self.register(ResourceCollector(resources))
        self.register(LaneCollector(lambda: getattr(resources(), "lane", None)))

    def observe(self, method: str, route: str, status: int, seconds: float) -> None:
        key = (method, route, status)
        children = self._children.get(key)
        if children is None:
            children = self._children[key] = (
                self.requests.labels(method, route, str(status)),
                self.latency.labels(method, route),
            )
        children[0].inc()
        children[1].observe(seconds)


#: The gauges :class:`ResourceCollector` reads, and their help.
RESOURCE_GAUGES = {
    "conduit_api_waiters": "Prefer: wait and SSE waiters held.",
    "conduit_api_max_waiters": "Most waiters this process holds.",
    "conduit_api_db_pool_checked_out": "Postgres connections in use.",
    "conduit_api_db_pool_size": "Postgres connections the pool keeps.",
    "conduit_api_redis_pool_in_use": "Redis connections in use.",
    "conduit_api_redis_pool_max": "Most Redis connections the pool opens.",
}


def _gauge(name: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, RESOURCE_GAUGES[name], value=value)


class ResourceCollector(Collector):
    """Gauges read from the live objects at each scrape, so they are never stale."""

    def __init__(self, resources: Callable[[], Resources | None]) -> None:
        self._resources = resources

    def describe(self) -> Iterator[Metric]:
        """Every gauge :meth:`collect` may yield, empty: known before the resources open."""
        for name, documentation in RESOURCE_GAUGES.items():
            yield GaugeMetricFamily(name, documentation)

    def collect(self) -> Iterator[Metric]:
        resources = self._resources()
        if resources is None:
            return
        hub = resources.hub
        yield _gauge("conduit_api_waiters", hub.waiters)
        yield _gauge("conduit_api_max_waiters", hub.max_waiters)
        pool = resources.engine.pool
        size = getattr(pool, "size", None)
        checked_out = getattr(pool, "checkedout", None)
        if callable(size) and callable(checked_out):
            yield _gauge("conduit_api_db_pool_checked_out", checked_out())
            yield _gauge("conduit_api_db_pool_size", size())
        redis_pool = getattr(resources.redis, "connection_pool", None)
        in_use = getattr(redis_pool, "_in_use_connections", None)
        if redis_pool is not None and in_use is not None:
            yield _gauge("conduit_api_redis_pool_in_use", len(in_use))
            yield _gauge("conduit_api_redis_pool_max", getattr(redis_pool, "max_connections", 0))


class RequestMetrics:
    """Pure ASGI middleware: counts and times every HTTP request by its route template."""

    def __init__(self, app: ASGIApp, metrics: ApiMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500  # what the client gets when the app fails before answering

        async def recording_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, recording_send)
        finally:
            # The router writes the matched route into the scope it was handed (this one).
            route = getattr(scope.get("route"), "path", None) or UNMATCHED
            self.metrics.observe(scope["method"], route, status, time.perf_counter() - started)


router = APIRouter()


@router.get("/metrics", include_in_schema=False)
async def metrics(request: Request) -> Response:
    if request.app.state.resources.settings.metrics_port is not None:
        raise NotFound("metrics are served on their own port")
    body = request.app.state.metrics.exposition()
    return Response(body, media_type=CONTENT_TYPE_LATEST)
