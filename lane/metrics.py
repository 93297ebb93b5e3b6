"""The lane's Prometheus metrics, read from the core's counters at each scrape.

Per deployment (a bounded label: deployments are made by operators): ``lane_queue_depth``,
``lane_in_flight``, ``lane_permits{state}`` (``free``, ``used``, ``full``: held back after a
refusal or an ejection), ``lane_rejections_total{reason}``, ``lane_retries_total``,
``lane_retry_budget_exhausted_total``; and the records written after the runs,
``lane_records_total`` and ``lane_record_failures_total``. ``lane_queue_wait_seconds`` is a
histogram observed at each dispatch (:class:`LaneWait`), on the same registry.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Protocol

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from lane.core_records import LaneCounters
from lane.events import RejectReason

#: Queue waits (s): most requests wait nothing; the queue's TTL is 30 s.
WAIT_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class LaneState(Protocol):
    def snapshot(self) -> dict[str, LaneCounters]: ...

    @property
    def records_written(self) -> int: ...

    @property
    def record_failures(self) -> int: ...


class LaneWait:
    """``lane_queue_wait_seconds{deployment}``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.histogram = Histogram(
            "lane_queue_wait_seconds",
            "Seconds a /run request waited in the lane's queue for a permit.",
            ["deployment"],
            buckets=WAIT_BUCKETS,
            registry=registry,
        )
        #: Each deployment's child, looked up once (``labels()`` checks and locks each call).
        self._children: dict[str, Histogram] = {}

    def observe(self, deployment: str, seconds: float) -> None:
        child = self._children.get(deployment)
        if child is None:
            child = self._children[deployment] = self.histogram.labels(deployment)
        child.observe(seconds)


class LaneCollector(Collector):
    def __init__(self, lane: Callable[[], LaneState | None]) -> None:
        self._lane = lane

    def describe(self) -> Iterator[Metric]:
        """The families :meth:`collect` yields, empty: known without a lane (the registry's
        names, the metrics reference)."""
        yield from _per_deployment()
        yield from _totals()

    def collect(self) -> Iterator[Metric]:
        lane = self._lane()
        if lane is None:
            return
        counters = lane.snapshot()
        depth, in_flight, permits, rejections, retries, exhausted = _per_deployment()
        for name, c in sorted(counters.items()):
            depth.add_metric([name], c.queue_depth)
            in_flight.add_metric([name], c.in_flight)
            for state, value in (
                ("free", c.permits_free),
                ("used", c.permits_used),
                ("full", c.permits_full),
            ):
                permits.add_metric([name, state], value)
            for reason in RejectReason:
                rejections.add_metric([name, reason.value], c.rejections_total.get(reason, 0))
            retries.add_metric([name], c.retries_total)
            exhausted.add_metric([name], c.retry_budget_exhausted_total)
        yield from (depth, in_flight, permits, rejections, retries, exhausted)
        records, failures = _totals()
        records.add_metric([], lane.records_written)
        failures.add_metric([], lane.record_failures)
        yield from (records, failures)


def _per_deployment() -> tuple[
    GaugeMetricFamily,
    GaugeMetricFamily,
    GaugeMetricFamily,
    CounterMetricFamily,
    CounterMetricFamily,
    CounterMetricFamily,
]:
    """The per-deployment families, empty."""
    return (
        GaugeMetricFamily(
            "lane_queue_depth", "Requests queued for a permit.", labels=["deployment"]
        ),
        GaugeMetricFamily("lane_in_flight", "Requests on a runner now.", labels=["deployment"]),
        GaugeMetricFamily(
            "lane_permits",
            "This replica's permits: free, used, or full (held back after a refusal or an "
            "ejection).",
            labels=["deployment", "state"],
        ),
        CounterMetricFamily(
            "lane_rejections",
            "Requests refused without a run, by why (runner_unavailable: a 503, the others a "
            "429 out_of_capacity).",
            labels=["deployment", "reason"],
        ),
        CounterMetricFamily(
            "lane_retries", "Attempts retried on another runner.", labels=["deployment"]
        ),
        CounterMetricFamily(
            "lane_retry_budget_exhausted",
            "Retries not made: the retry budget was spent.",
            labels=["deployment"],
        ),
    )


def _totals() -> tuple[CounterMetricFamily, CounterMetricFamily]:
    """The records written after the runs, and those that could not be, empty."""
    return (
        CounterMetricFamily("lane_records", "Runs recorded after their answer.", labels=[]),
        CounterMetricFamily(
            "lane_record_failures",
            "Runs whose record could not be written (the caller had its answer).",
            labels=[],
        ),
    )
