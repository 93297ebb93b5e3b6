"""The fleet registry: which runners exist, what they serve, how many requests each takes.

Every runner is known by one entry in Redis, written by the director that drives it (so a
stock Cog server is covered too): ``fleet:{fleet}:runner:<id>``, JSON, with an expiry of
``ttl`` that each heartbeat renews, plus the index ``fleet:{fleet}:runners``, a sorted set of
entry ids scored by last heartbeat. An entry disappears when its heartbeats stop, by Redis's
own expiry (hash fields cannot expire before Redis 7.4, hence a key per runner). The index is
only a table of contents: ids whose entry has expired are pruned by readers.

- Writer side, :class:`FleetRegistry`: ``register`` / ``heartbeat`` (the same write: the
  entry as it is now) and ``deregister``.
- Reader side, :class:`FleetView`: a local copy refreshed in the background (one read of the
  index and one ``MGET``, no ``SCAN``); lookups never touch Redis.

The runner token is never stored here: whoever calls a runner has it from its own settings.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import orjson
from redis.asyncio import Redis

from core.periodic import Periodic
from core.transient import TRANSIENT
from tracker.keys import FLEET_INDEX, fleet_entry_key

log = logging.getLogger(__name__)


class RunnerState(enum.StrEnum):
    """What a runner is doing, as its director sees it."""

    READY = "ready"  # answering, model loaded: takes requests
    LOADING = "loading"  # starting, or its model is loading
    DRAINING = "draining"  # its director is stopping: no new requests
    UNHEALTHY = "unhealthy"  # unreachable, or its setup failed


@dataclass(frozen=True, slots=True)
class FleetEntry:
    """One runner, as the registry holds it (JSON via orjson)."""

    #: Stable per runner: :func:`runner_entry_id` of its public URL.
    id: str
    #: Base URL by which api replicas reach the runner.
    url: str
    #: The deployment served (``owner/name``) and its version id.
    deployment: str
    version_id: str
    #: Requests the runner takes at once (its advertised slots; 1 when it does not say).
    concurrency: int
    state: RunnerState
    #: ``cpu``, ``gpu`` or ``unknown`` (what usage is billed as).
    hardware: str
    #: Epoch seconds of the writer's latest heartbeat.
    heartbeat_at: float
    #: The director driving the runner.
    director: str
    #: ``cog`` (stock Cog) or the runner's own ``runnerType`` (``conduit-echo``).
    kind: str = "cog"
    #: The id the runner gives itself, when it gives one.
    runner_id: str | None = None

    @property
    def ready(self) -> bool:
        return self.state is RunnerState.READY

    def age(self, now: float | None = None) -> float:
        """Seconds since the latest heartbeat (by this host's clock)."""
        return max(0.0, (time.time() if now is None else now) - self.heartbeat_at)

    def to_json(self) -> bytes:
        return orjson.dumps(self)

    @classmethod
    def from_json(cls, data: bytes | str) -> FleetEntry | None:
        """The entry; None for a document that is not one (logged). Unknown members are
        ignored, so readers of an older release read a newer writer's entries."""
        try:
            body = orjson.loads(data)
            known = {f.name for f in dataclasses.fields(cls)}
            fields: dict[str, Any] = {k: v for k, v in body.items() if k in known}
            fields["state"] = RunnerState(fields["state"])
            entry = cls(**fields)
        except (orjson.JSONDecodeError, AttributeError, KeyError, TypeError, ValueError) as error:
            log.warning("unreadable fleet entry: %r", error)
            return None
        return entry


def runner_entry_id(url: str) -> str:
    """A runner's entry id: from the URL it is reached by, so every director driving one
    runner writes one entry, and a restarted director finds its own."""
    return "r-" + hashlib.sha256(url.rstrip("/").encode()).hexdigest()[:16]


class FleetRegistry:
    """Writes entries. ``ttl``: seconds an entry lives without a heartbeat (a few heartbeat
    intervals, so one late heartbeat does not drop a runner)."""

    def __init__(self, redis: Redis, ttl: float) -> None:
        self.redis = redis
        self.ttl_ms = max(1, round(ttl * 1000))

    async def register(self, entry: FleetEntry) -> None:
        await self.heartbeat(entry)
        log.info(
            "fleet: runner %s at %s serves %s (%s, concurrency %d)",
            entry.id,
            entry.url,
            entry.deployment,
            entry.state,
            entry.concurrency,
        )

    async def heartbeat(self, entry: FleetEntry) -> None:
        """Write the entry as it is now and renew its expiry. The entry is written before the
        index, so a reader that finds an id in the index and no entry knows it expired."""
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.set(fleet_entry_key(entry.id), entry.to_json(), px=self.ttl_ms)
            pipe.zadd(FLEET_INDEX, {entry.id: round(entry.heartbeat_at * 1000)})
            await pipe.execute()

    async def deregister(self, entry_id: str) -> None:
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.delete(fleet_entry_key(entry_id))
            pipe.zrem(FLEET_INDEX, entry_id)
            await pipe.execute()
        log.info("fleet: runner %s deregistered", entry_id)


# Drops from the index the ids whose entry is gone, atomically with the check (a runner that
# heartbeats again between a reader's MGET and its prune keeps its place).
# KEYS: the index, then each id's entry key; ARGV: the ids.
_PRUNE = """
local removed = 0
for i, id in ipairs(ARGV) do
    if redis.call('EXISTS', KEYS[i + 1]) == 0 then
        removed = removed + redis.call('ZREM', KEYS[1], id)
    end
end
return removed
"""


async def read_fleet(redis: Redis) -> dict[str, FleetEntry]:
    """Every live entry, by id: the index, then one ``MGET``; expired ids are pruned."""
    raw_ids = await redis.zrange(FLEET_INDEX, 0, -1)
    ids = [i.decode() if isinstance(i, bytes) else str(i) for i in raw_ids]
    if not ids:
        return {}
    keys = [fleet_entry_key(i) for i in ids]
    values = await redis.mget(keys)
    entries: dict[str, FleetEntry] = {}
    missing: list[str] = []
    for entry_id, value in zip(ids, values, strict=True):
        entry = None if value is None else FleetEntry.from_json(value)
        if entry is None:
            if value is None:
                missing.append(entry_id)
            continue
        entries[entry.id] = entry
    if missing:
        prune_keys = [FLEET_INDEX, *(fleet_entry_key(i) for i in missing)]
        await redis.eval(_PRUNE, len(prune_keys), *prune_keys, *missing)
    return entries


def _comparable(entry: FleetEntry) -> FleetEntry:
    """An entry less its heartbeat time: what a change of the fleet is judged by."""
    return dataclasses.replace(entry, heartbeat_at=0.0)


class FleetView:
    """A local copy of the registry, refreshed every ``interval`` seconds in the background.

    Lookups read the copy: no Redis round trip per request. While Redis is away the last
    copy is kept (a runner's own refusal corrects a stale view). ``on_change(entries)`` is
    called after a refresh that changed anything but heartbeat times (a runner joined, left,
    or changed state, URL or concurrency); so is every listener :meth:`subscribe` adds, so one
    view serves every reader of a process.
    """

    def __init__(
        self,
        redis: Redis,
        interval: float = 1.0,
        on_change: Callable[[Mapping[str, FleetEntry]], None] | None = None,
    ) -> None:
        self.redis = redis
        self.interval = interval
        self._listeners: list[Callable[[Mapping[str, FleetEntry]], None]] = []
        if on_change is not None:
            self._listeners.append(on_change)
        self._entries: Mapping[str, FleetEntry] = MappingProxyType({})
        self._ready: dict[str, tuple[FleetEntry, ...]] = {}
        self._ready_versions: dict[str, tuple[FleetEntry, ...]] = {}
        #: ``time.monotonic()`` of the latest successful refresh; None before the first.
        self.refreshed_at: float | None = None
        self._refreshes = Periodic(
            "fleet-view", interval, self.refresh, "fleet view refresh", log, TRANSIENT
        )

    def subscribe(self, listener: Callable[[Mapping[str, FleetEntry]], None]) -> None:
        """Also call ``listener(entries)`` after every refresh that changes the fleet."""
        self._listeners.append(listener)

    @property
    def entries(self) -> Mapping[str, FleetEntry]:
        """Every entry, ready or not, by id."""
        return self._entries

    def runners_for(self, deployment: str) -> tuple[FleetEntry, ...]:
        """The ready runners of a deployment (``owner/name``), each with its URL and
        concurrency; empty when none."""
        return self._ready.get(deployment, ())

    def runners_serving(self, version_id: str) -> tuple[FleetEntry, ...]:
        """The ready runners serving a version (of any deployment)."""
        return self._ready_versions.get(version_id, ())

    async def refresh(self) -> None:
        """Read the registry now (raises what Redis raises)."""
        self._install(await read_fleet(self.redis))
        self.refreshed_at = time.monotonic()

    def _install(self, entries: dict[str, FleetEntry]) -> None:
        changed = _signature(entries.values()) != _signature(self._entries.values())
        ready: dict[str, list[FleetEntry]] = {}
        versions: dict[str, list[FleetEntry]] = {}
        for entry in sorted(entries.values(), key=lambda e: e.id):
            if entry.ready:
                ready.setdefault(entry.deployment, []).append(entry)
                versions.setdefault(entry.version_id, []).append(entry)
        self._entries = MappingProxyType(entries)
        self._ready = {name: tuple(group) for name, group in ready.items()}
        self._ready_versions = {name: tuple(group) for name, group in versions.items()}
        if changed:
            for listener in self._listeners:
                listener(self._entries)

    async def start(self) -> None:
        """Read once (a failure is logged, not raised), then keep refreshing in the
        background until :meth:`stop`."""
        await self._refreshes.step_logged()
        self._refreshes.start()

    async def stop(self) -> None:
        await self._refreshes.stop()


def _signature(entries: Iterable[FleetEntry]) -> frozenset[FleetEntry]:
    return frozenset(_comparable(e) for e in entries)
