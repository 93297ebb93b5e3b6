"""The metrics reference, ``docs/reference/metrics.md``, filled in from each process's metrics
objects each time the site is built, so it never lags the code: ``mkdocs.yml`` loads this
module as a hook, which replaces the page's marker with a table per process of every metric on
its ``/metrics``. ``python -m conduit.metrics_doc`` prints the same text.

Each process's metrics object is built on a registry of its own, as its composition root
builds it, and every collector on that registry is asked to ``describe()`` its families: the
metrics prometheus_client keeps do, and so do the collectors that read live objects at a
scrape (they describe their families empty, with no live object). A collector that cannot
describe itself stops the build rather than be left out."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from prometheus_client import CollectorRegistry

if TYPE_CHECKING:
    from runners.pool.state import Pool

MARKER = "<!-- metrics -->"
#: What Prometheus appends to a family's name in the exposition.
SUFFIX = {"counter": "_total", "info": "_info"}


@dataclass(frozen=True)
class Described:
    name: str
    """As ``/metrics`` shows it (a counter's with ``_total``)."""
    type: str
    labels: tuple[str, ...]
    help: str


@dataclass(frozen=True)
class Process:
    title: str
    where: str
    """Where its ``/metrics`` is served."""
    registry: Callable[[], CollectorRegistry]


def _api() -> CollectorRegistry:
    from api.metrics import ApiMetrics

    metrics = ApiMetrics()
    metrics.watch(lambda: None)  # as the app does, before its resources open
    return metrics.registry


def _director() -> CollectorRegistry:
    from director.metrics import DirectorMetrics

    return DirectorMetrics().registry


def _runner() -> CollectorRegistry:
    from runners.metrics import RunnerMetrics

    return RunnerMetrics().registry


def _pool() -> CollectorRegistry:
    from runners.pool.metrics import PoolMetrics

    # Its collector reads the pool only at a scrape; describing it reads nothing.
    return PoolMetrics(cast("Pool", None)).registry


def _gateway() -> CollectorRegistry:
    from redis.asyncio import Redis
    from sqlalchemy.ext.asyncio import create_async_engine

    from gateway.metrics import GatewayMetrics
    from gateway.quota import Quota
    from gateway.request_log import RequestLogWriter

    # As ``gateway.server.serve`` builds them; neither client connects until it is used.
    metrics = GatewayMetrics()
    Quota(Redis(), lambda: None, registry=metrics.registry)
    engine = create_async_engine("postgresql+psycopg://")
    RequestLogWriter(engine, registry=metrics.registry)
    return metrics.registry


PROCESSES = (
    Process(
        "api",
        "`conduit api`: on the API's port, or only on `CONDUIT_API_METRICS_PORT` when it is set",
        _api,
    ),
    Process(
        "director",
        "`conduit director`: on its receiver's port (`CONDUIT_DIRECTOR_RECEIVER_PORT`)",
        _director,
    ),
    Process(
        "runner",
        "`conduit runner MODEL`: on the runner's port, behind the runner token "
        "(`CONDUIT_RUNNER_TOKEN`) as its other routes but the health checks",
        _runner,
    ),
    Process(
        "model pool host",
        "`conduit runner pool`: on the pool host's port, behind the runner token as a runner's",
        _pool,
    ),
    Process(
        "gateway",
        "`conduit gateway`: only when `CONDUIT_GATEWAY_METRICS_PORT` is set, on that port",
        _gateway,
    ),
)


def describe(registry: CollectorRegistry) -> list[Described]:
    """Every family of ``registry``, by name."""
    found: list[Described] = []
    for collector in _collectors(registry):
        describe_families = getattr(collector, "describe", None)
        if describe_families is None:
            raise TypeError(f"{collector!r} has no describe(): its metrics cannot be listed")
        for family in describe_families():
            # prometheus_client keeps label names only privately: on a metric it keeps (the
            # collector), or on a family a collector builds.
            labels: Any = getattr(family, "_labelnames", None)
            if labels is None:
                labels = getattr(collector, "_labelnames", ())
            found.append(
                Described(
                    family.name + SUFFIX.get(family.type, ""),
                    family.type,
                    tuple(labels),
                    family.documentation,
                )
            )
    return sorted(found, key=lambda d: d.name)


def _collectors(registry: CollectorRegistry) -> Iterator[Any]:
    # prometheus_client lists a registry's collectors only privately.
    yield from list(registry._collector_to_names)


def render() -> str:
    parts = []
    for process in PROCESSES:
        rows = [
            f"## {process.title}\n",
            f"{process.where}.\n",
            "| Metric | Type | Labels | Help |",
            "|---|---|---|---|",
        ]
        for d in describe(process.registry()):
            labels = ", ".join(f"`{label}`" for label in d.labels) or "none"
            text = d.help.replace("|", "\\|")
            rows.append(f"| `{d.name}` | {d.type} | {labels} | {text} |")
        parts.append("\n".join(rows) + "\n")
    return "\n".join(parts)


def on_page_markdown(markdown: str, **_: Any) -> str:
    """MkDocs' hook: the marker becomes the reference."""
    return markdown.replace(MARKER, render()) if MARKER in markdown else markdown


if __name__ == "__main__":
    print(render(), end="")
