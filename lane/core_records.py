"""What the lane's core keeps (:mod:`lane.core`): its configuration, a record per request and
per deployment, and the counters it reports."""

from __future__ import annotations

from dataclasses import dataclass, field

from lane.budget import RetryBudget
from lane.estimate import ServiceTime
from lane.events import RejectReason
from lane.queue import FairQueue
from lane.runners import Health, RunnerPool


@dataclass(frozen=True, slots=True)
class LaneConfig:
    queue_factor: int = 10
    """``max_queue`` per deployment = this × the deployment's permits on this replica."""
    queue_ttl_s: float = 30.0
    max_attempts: int = 2
    retry_budget_ratio: float = 0.2
    retry_budget_min: int = 3
    health: Health = field(default_factory=Health)
    service_p50_default_s: float = 1.0
    """The service-time estimate before any call has completed."""
    retry_after_min_s: int = 1
    retry_after_max_s: int = 30
    no_runner_retry_after_s: int = 5
    """About one fleet refresh: when a runner may have appeared."""


@dataclass(frozen=True, slots=True)
class LaneCounters:
    """One deployment's numbers for the metrics (``*_total`` are cumulative)."""

    queue_depth: int
    in_flight: int
    permits_free: int
    permits_used: int
    permits_full: int
    rejections_total: dict[RejectReason, int]
    retrying: int
    """Retries in flight (what the retry budget bounds)."""
    retries_total: int
    retry_budget_exhausted_total: int
    out_of_service: tuple[str, ...] = ()
    """Runners taken out of service for refusing this server's runner token."""


@dataclass(slots=True)
class LaneRequest:
    """A request the core tracks, from its arrival to its end."""

    request_id: str
    deployment: str
    account: str
    band: int
    arrived_at: float
    expires_at: float
    attempt: int = 0
    runner: str | None = None
    """The runner of the attempt in flight; None while queued."""
    started_at: float = 0.0
    tried: list[str] = field(default_factory=list)
    retrying: bool = False
    """The attempt in flight is a retry (it holds a share of the retry budget)."""
    cancelled: bool = False


@dataclass(slots=True)
class LaneDeployment:
    """One deployment's permits (its runners), queue, retry budget and counts."""

    pool: RunnerPool
    queue: FairQueue
    budget: RetryBudget
    service: ServiceTime
    rejections: dict[RejectReason, int] = field(
        default_factory=lambda: dict.fromkeys(RejectReason, 0)
    )
    retries: int = 0
    budget_exhausted: int = 0

    def counters(self, now: float) -> LaneCounters:
        """Its numbers for the metrics, as of ``now``."""
        free, used, full = self.pool.permit_states(now)
        return LaneCounters(
            queue_depth=len(self.queue),
            in_flight=self.pool.in_flight,
            permits_free=free,
            permits_used=used,
            permits_full=full,
            rejections_total=dict(self.rejections),
            retrying=self.budget.retrying,
            retries_total=self.retries,
            retry_budget_exhausted_total=self.budget_exhausted,
            out_of_service=tuple(self.pool.out_of_service(now)),
        )
