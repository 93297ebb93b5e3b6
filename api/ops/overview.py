"""The overview: a row per deployable, put together from Postgres (``api.ops.reads``) and
Redis (``api.ops.queue_view``), and what on it needs the operator's attention.

A deployment's directors read its own streams and its version's (``vp-<id>``: predictions made
with the version id), so a deployment's row counts both, with the version's part beside it: a
backlog on the version must not leave the deployment's row reading 0. Trainings (``tp-<id>``)
are rows of their own. Redis away is shown as "unknown" beside Postgres's counts, never as 0.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

from redis.exceptions import RedisError

from api.deps import Resources
from api.ops import queue_view, reads
from api.ops.queue_view import ShardState
from tracker.keys import Kind, Target

log = logging.getLogger(__name__)

#: Seconds a page waits for Redis before it shows Redis's numbers as unknown.
REDIS_WAIT = 2.0
#: An oldest waiting entry older than this marks its row.
LATE_AFTER_MS = 30_000


def target_of(name: str, shards: int) -> Target:
    kind, _, key = name.partition("-")
    return Target(Kind(kind), key, shards)


@dataclass
class QueueRow:
    """One deployable on the overview (a deployment's row: with its version's part)."""

    target: str
    label: str
    shards: int
    kind: Kind
    #: From Redis; None: unknown (Redis could not be read).
    waiting: int | None = None
    #: ``waiting`` is a lower bound: a shard's count stopped at its cap.
    waiting_capped: bool = False
    in_flight: int | None = None
    oldest_wait_ms: int | None = None
    consumers: int | None = None
    #: From Postgres.
    starting: int = 0
    processing: int = 0
    finished_hour: int = 0
    failed_hour: int = 0
    #: A deployment's version, whose numbers this row's include (None: not a deployment).
    version: QueueRow | None = None
    #: Other deployments that run the same version (they count its part as well).
    sharing: list[str] = field(default_factory=list)

    @property
    def error_rate(self) -> float | None:
        return self.failed_hour / self.finished_hour if self.finished_hour else None

    @property
    def mismatch(self) -> bool:
        """Postgres and Redis disagree on what is queued or running: the reconciler's work."""
        if self.waiting is None or self.in_flight is None or self.waiting_capped:
            return False
        return self.waiting + self.in_flight != self.starting + self.processing

    @property
    def unread(self) -> bool:
        """Entries wait and no director reads its streams."""
        return bool(self.waiting) and self.consumers == 0

    @property
    def late(self) -> bool:
        return self.oldest_wait_ms is not None and self.oldest_wait_ms >= LATE_AFTER_MS

    @property
    def attention(self) -> list[str]:
        """Why this row needs a look (empty: it does not)."""
        reasons = []
        if self.unread:
            reasons.append("waiting, no director reads it")
        if self.late:
            reasons.append(f"oldest waiting over {LATE_AFTER_MS // 1000} s")
        if self.failed_hour:
            reasons.append(f"{self.failed_hour:,} failed in the last hour")
        return reasons

    @property
    def version_shows(self) -> bool:
        """Its version's part is worth a line of its own: anything queued, running or done."""
        v = self.version
        return v is not None and bool(
            v.waiting or v.in_flight or v.starting or v.processing or v.finished_hour
        )

    def fill(self, shards: list[ShardState]) -> None:
        self.waiting = sum(s.waiting for s in shards)
        self.waiting_capped = any(s.capped for s in shards)
        self.in_flight = sum(s.pending for s in shards)
        ages = [s.oldest_wait_ms for s in shards if s.oldest_wait_ms is not None]
        self.oldest_wait_ms = max(ages) if ages else None
        self.consumers = max((s.consumers for s in shards), default=0)

    def include(self, part: QueueRow) -> None:
        """Add ``part``'s numbers (a deployment's version) to this row's."""
        if self.waiting is not None and part.waiting is not None:
            self.waiting += part.waiting
            self.waiting_capped = self.waiting_capped or part.waiting_capped
        if self.in_flight is not None and part.in_flight is not None:
            self.in_flight += part.in_flight
        ages = [a for a in (self.oldest_wait_ms, part.oldest_wait_ms) if a is not None]
        self.oldest_wait_ms = max(ages) if ages else None
        if self.consumers is not None and part.consumers is not None:
            self.consumers = max(self.consumers, part.consumers)
        self.starting += part.starting
        self.processing += part.processing
        self.finished_hour += part.finished_hour
        self.failed_hour += part.failed_hour


def _row(
    t: Any, unfinished: dict[str, dict[str, int]], hour: dict[str, dict[str, int]]
) -> QueueRow:
    name = t["target"]
    counts, done = unfinished.get(name, {}), hour.get(name, {})
    return QueueRow(
        name,
        t["label"],
        int(t["shards"]),
        target_of(name, int(t["shards"])).kind,
        starting=counts.get("starting", 0),
        processing=counts.get("processing", 0),
        finished_hour=done.get("finished", 0),
        failed_hour=done.get("failed", 0),
    )


def _active(row: QueueRow) -> bool:
    return bool(row.starting or row.processing or row.finished_hour or row.failed_hour)


async def overview(resources: Resources) -> tuple[list[QueueRow], str | None]:
    """A row per deployment (with its version's part), per other version or training target
    that has anything queued, running or finished in the last hour; and what went wrong
    reading Redis (None: nothing). One read of each kind, whatever the number of rows."""
    engine = resources.reads
    targets, unfinished, hour = await asyncio.gather(
        reads.deployables(engine),
        reads.unfinished_by_target(engine),
        reads.last_hour_by_target(engine),
    )
    every = {t["target"]: _row(t, unfinished, hour) for t in targets}
    deployments = [r for r in every.values() if r.kind is Kind.DEPLOYMENT]
    version_of: dict[str, str] = {}  # deployment target → its version's target
    runs: dict[str, list[str]] = {}  # version target → the deployments that run it
    for t in targets:
        if every[t["target"]].kind is Kind.DEPLOYMENT and t["version_id"]:
            version = f"{Kind.VERSION}-{t['version_id']}"
            version_of[t["target"]] = version
            runs.setdefault(version, []).append(t["label"])
    parts = {name: every[name] for name in runs if name in every}
    alone = [r for r in every.values() if r.kind is not Kind.DEPLOYMENT and r.target not in runs]
    rows = deployments + [r for r in alone if _active(r)]
    read = rows + list(parts.values())
    streams = {r.target: target_of(r.target, r.shards).all_streams() for r in read}
    redis_problem = None
    try:
        states = await asyncio.wait_for(
            queue_view.shard_states(
                resources.redis, [s for group in streams.values() for s in group]
            ),
            REDIS_WAIT,
        )
        for row in read:
            row.fill([states[s] for s in streams[row.target]])
    except (RedisError, OSError, TimeoutError) as error:
        log.warning("overview: Redis unreadable: %r", error)
        redis_problem = f"Redis could not be read ({type(error).__name__}): its counts are unknown"
    for row in deployments:
        part = parts.get(version_of.get(row.target, ""))
        if part is not None:
            row.version = part
            row.sharing = [d for d in runs[part.target] if d != row.label]
            row.include(part)
    return rows, redis_problem
