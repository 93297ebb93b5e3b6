"""The pool host's Prometheus metrics (``/metrics``): :class:`PoolMetrics`, built once by the
host's composition root (``runners.pool.http``), its figures read from the core at each
scrape."""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

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


class PoolCollector(Collector):
    """The pool's figures, read from the core at each scrape."""

    _BUCKETS: ClassVar[tuple[float, ...]] = (0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)

    def __init__(self, pool: Pool) -> None:
        self.pool = pool

    def collect(self) -> Iterator[Metric]:
        yield from self._counts()
        yield from self._slots()
        yield from self._memory()

    def _counts(self) -> Iterator[Metric]:
        core, now = self.pool.core, self.pool.host.now()
        stats = core.stats
        for name, counts, text in (
            ("loads", stats.loads_total, "Model loads started, by why"),
            ("evictions", stats.evictions_total, "Unloads forced by memory or an operator"),
            ("unloads", stats.unloads_total, "Every unload, by its reason"),
        ):
            family = CounterMetricFamily(f"conduit_pool_{name}", text, labels=["reason"])
            for reason, count in sorted(counts.items()):
                family.add_metric([reason], count)
            yield family
        requests = CounterMetricFamily("conduit_pool_requests", "Requests the core has seen")
        requests.add_metric([], stats.requests_total)
        yield requests
        seconds = sorted(stats.load_seconds)
        buckets = [(str(b), sum(1 for s in seconds if s <= b)) for b in self._BUCKETS]
        load = HistogramMetricFamily("conduit_pool_load_seconds", "Time a load took")
        load.add_metric([], [*buckets, ("+Inf", len(seconds))], sum(seconds))
        yield load
        thrash = GaugeMetricFamily(
            "conduit_pool_thrash_ratio", "Loads / requests over the last window (5 min)"
        )
        thrash.add_metric([], stats.thrash_ratio(now))
        yield thrash
        queue = GaugeMetricFamily("conduit_pool_queue_depth", "Requests waiting in the core")
        queue.add_metric([], core.queued())
        yield queue

    def _slots(self) -> Iterator[Metric]:
        state = GaugeMetricFamily(
            "conduit_pool_slot_state", "1 for each slot's current state", labels=["model", "state"]
        )
        in_flight = GaugeMetricFamily(
            "conduit_pool_slot_in_flight", "Requests running", labels=["model"]
        )
        lease = GaugeMetricFamily(
            "conduit_pool_slot_lease_bytes", "Bytes leased per device", labels=["model"]
        )
        for view in self.pool.core.slots():
            for each in SlotState:
                state.add_metric([view.model, each.value], 1.0 if view.state is each else 0.0)
            in_flight.add_metric([view.model], view.in_flight)
            lease.add_metric([view.model], view.lease_bytes)
        yield from (state, in_flight, lease)

    def _memory(self) -> Iterator[Metric]:
        core = self.pool.core
        budget = GaugeMetricFamily("conduit_pool_budget_bytes", "Budget", labels=["device"])
        used = GaugeMetricFamily("conduit_pool_leased_bytes", "Leased", labels=["device"])
        for device, total in core.budgets().items():
            budget.add_metric([str(device)], total)
            used.add_metric([str(device)], core.used(device))
        yield from (budget, used)


class PoolMetrics(ProcessMetrics):
    def __init__(self, pool: Pool) -> None:
        super().__init__()
        self.register(PoolCollector(pool))
