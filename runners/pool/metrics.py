"""The pool host's Prometheus metrics (``/metrics``): :class:`PoolMetrics`, built once by the
host's composition root (``runners.pool.http``), its figures read from the core at each
scrape."""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar, NamedTuple

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from core.metrics import ProcessMetrics
from runners.pool.slots import SlotState
from runners.pool.state import Pool


class _Families(NamedTuple):
    """Every family :class:`PoolCollector` yields, in order, empty until a scrape fills them."""

    loads: CounterMetricFamily
    evictions: CounterMetricFamily
    unloads: CounterMetricFamily
    requests: CounterMetricFamily
    load_seconds: HistogramMetricFamily
    thrash_ratio: GaugeMetricFamily
    queue_depth: GaugeMetricFamily
    slot_state: GaugeMetricFamily
    slot_in_flight: GaugeMetricFamily
    slot_lease: GaugeMetricFamily
    budget: GaugeMetricFamily
    leased: GaugeMetricFamily


def _families() -> _Families:
    def by_reason(name: str, text: str) -> CounterMetricFamily:
        return CounterMetricFamily(f"conduit_pool_{name}", text, labels=["reason"])

    return _Families(
        by_reason("loads", "Model loads started, by why"),
        by_reason("evictions", "Unloads forced by memory or an operator"),
        by_reason("unloads", "Every unload, by its reason"),
        CounterMetricFamily("conduit_pool_requests", "Requests the core has seen", labels=[]),
        HistogramMetricFamily("conduit_pool_load_seconds", "Time a load took", labels=[]),
        GaugeMetricFamily(
            "conduit_pool_thrash_ratio", "Loads / requests over the last window (5 min)", labels=[]
        ),
        GaugeMetricFamily("conduit_pool_queue_depth", "Requests waiting in the core", labels=[]),
        GaugeMetricFamily(
            "conduit_pool_slot_state", "1 for each slot's current state", labels=["model", "state"]
        ),
        GaugeMetricFamily("conduit_pool_slot_in_flight", "Requests running", labels=["model"]),
        GaugeMetricFamily(
            "conduit_pool_slot_lease_bytes", "Bytes leased per device", labels=["model"]
        ),
        GaugeMetricFamily("conduit_pool_budget_bytes", "Budget", labels=["device"]),
        GaugeMetricFamily("conduit_pool_leased_bytes", "Leased", labels=["device"]),
    )


class PoolCollector(Collector):
    """The pool's figures, read from the core at each scrape."""

    _BUCKETS: ClassVar[tuple[float, ...]] = (0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)

    def __init__(self, pool: Pool) -> None:
        self.pool = pool

    def describe(self) -> Iterator[Metric]:
        """The families :meth:`collect` yields, empty: the pool is not read."""
        yield from _families()

    def collect(self) -> Iterator[Metric]:
        families = _families()
        self._counts(families)
        self._slots(families)
        self._memory(families)
        yield from families

    def _counts(self, f: _Families) -> None:
        core, now = self.pool.core, self.pool.host.now()
        stats = core.stats
        for family, counts in (
            (f.loads, stats.loads_total),
            (f.evictions, stats.evictions_total),
            (f.unloads, stats.unloads_total),
        ):
            for reason, count in sorted(counts.items()):
                family.add_metric([reason], count)
        f.requests.add_metric([], stats.requests_total)
        seconds = sorted(stats.load_seconds)
        buckets = [(str(b), sum(1 for s in seconds if s <= b)) for b in self._BUCKETS]
        f.load_seconds.add_metric([], [*buckets, ("+Inf", len(seconds))], sum(seconds))
        f.thrash_ratio.add_metric([], stats.thrash_ratio(now))
        f.queue_depth.add_metric([], core.queued())

    def _slots(self, f: _Families) -> None:
        for view in self.pool.core.slots():
            for each in SlotState:
                f.slot_state.add_metric(
                    [view.model, each.value], 1.0 if view.state is each else 0.0
                )
            f.slot_in_flight.add_metric([view.model], view.in_flight)
            f.slot_lease.add_metric([view.model], view.lease_bytes)

    def _memory(self, f: _Families) -> None:
        core = self.pool.core
        for device, total in core.budgets().items():
            f.budget.add_metric([str(device)], total)
            f.leased.add_metric([str(device)], core.used(device))


class PoolMetrics(ProcessMetrics):
    def __init__(self, pool: Pool) -> None:
        super().__init__()
        self.register(PoolCollector(pool))
