"""What each page but the overview (``api.ops.overview``) shows, put together from Postgres
(``api.ops.reads``) and Redis (``api.ops.queue_view``)."""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import text

from api.deps import Resources
from api.ops import queue_view, reads
from api.ops.overview import REDIS_WAIT, target_of
from api.ops.queue_view import Consumer
from api.ops.why import Waiting, explain
from lane.core_records import LaneCounters
from tracker import keys, sharding
from tracker.fleet import FleetEntry, read_fleet
from tracker.keys import Kind, Target


def _target(row: Any) -> Target:
    return target_of(row["target"], int(row["shards"]))


def target_streams(row: Any) -> list[str]:
    """The shard streams of a deployable (a row of ``reads.deployables``)."""
    return _target(row).all_streams()


async def why_waiting(resources: Resources, row: Any) -> Waiting:
    """The "why is this waiting?" panel of an unfinished prediction."""
    location = None
    holder_ttl = None
    target = (await reads.targets(resources.reads, {row["target"] or ""})).get(row["target"])
    if target is not None:
        mine = target.streams_for(row["account_id"])
        others = [s for s in target.all_streams() if s not in mine]
        since = int(row["created_at"].timestamp() * 1000) - 60_000
        location = await queue_view.locate(resources.redis, mine + others, row["id"], since)
        if location is not None and location.holder:
            holder_ttl = (await queue_view.alive(resources.redis, [location.holder]))[
                location.holder
            ]
    return explain(
        status=row["status"],
        created_at=row["created_at"],
        deadline=row["deadline"],
        cancel_requested=row["cancel_requested"],
        attempt=row["attempt"],
        location=location,
        holder_ttl_ms=holder_ttl,
        visibility_timeout_s=resources.settings.ops_visibility_timeout,
        now=datetime.now(UTC),
    )


@dataclass
class Director:
    name: str
    streams: int = 0
    in_flight: int = 0
    idle_ms: int | None = None
    heartbeat_left_ms: int | None = None
    runners: list[FleetEntry] = field(default_factory=list)
    #: What it runs, by the streams it reads: ``predictions``, ``trainings`` (a trainer
    #: director, ``CONDUIT_DIRECTOR_JOB_KIND=training``), both; empty: it has read none.
    kinds: set[str] = field(default_factory=set)

    @property
    def kind(self) -> str:
        return " and ".join(sorted(self.kinds)) or "–"


@dataclass(frozen=True, slots=True)
class Workers:
    directors: list[Director]
    fleet: list[FleetEntry]
    #: Each runner's capability document by URL (a pool host's lists its slots, their leases,
    #: loads and last transitions); absent: it did not answer in time.
    documents: dict[str, dict[str, Any]]
    #: The api replicas serving the synchronous lane.
    lane: list[str]
    #: This replica's view of the lane per deployment: queue, permits, retries, rejections.
    lane_counters: dict[str, LaneCounters]


async def _documents(resources: Resources, fleet: list[FleetEntry]) -> dict[str, dict[str, Any]]:
    unique = {entry.url: entry for entry in fleet}

    async def read(entry: FleetEntry) -> dict[str, Any] | None:
        if resources.lane is None:
            return None
        try:
            return await asyncio.wait_for(
                resources.lane.client(entry).capabilities_document(), REDIS_WAIT
            )
        except (TimeoutError, RuntimeError):
            return None

    found = await asyncio.gather(*(read(entry) for entry in unique.values()))
    return {url: doc for url, doc in zip(unique, found, strict=True) if doc is not None}


async def workers(resources: Resources) -> Workers:
    """The directors (consumers of any shard, and fleet writers), the fleet and what each
    runner says of itself, the lane's api replicas."""
    targets = await reads.deployables(resources.reads)
    streams = [s for t in targets for s in _target(t).all_streams()]
    found: list[Consumer] = await queue_view.consumers(resources.redis, streams)
    fleet = await read_fleet(resources.redis)
    directors: dict[str, Director] = {}
    for consumer in found:
        d = directors.setdefault(consumer.name, Director(consumer.name))
        d.streams += 1
        parsed = keys.parse_input_stream(consumer.stream)
        if parsed is not None:
            d.kinds.add("trainings" if parsed.kind == Kind.TRAINING else "predictions")
        d.in_flight += consumer.pending
        d.idle_ms = consumer.idle_ms if d.idle_ms is None else min(d.idle_ms, consumer.idle_ms)
    for entry in fleet.values():
        directors.setdefault(entry.director, Director(entry.director)).runners.append(entry)
    alive = await queue_view.alive(resources.redis, list(directors))
    for name, left in alive.items():
        directors[name].heartbeat_left_ms = left
    members = await resources.redis.zrange(keys.LANE_MEMBERS, 0, -1)
    lane = [m.decode() if isinstance(m, bytes) else str(m) for m in members]
    ordered = sorted(directors.values(), key=lambda d: (d.heartbeat_left_ms is None, d.name))
    entries = sorted(fleet.values(), key=lambda e: e.id)
    counters = resources.lane.snapshot() if resources.lane is not None else {}
    return Workers(ordered, entries, await _documents(resources, entries), lane, counters)


async def fairness(resources: Resources, sample: int = 500) -> list[dict[str, Any]]:
    """Each account's share of each shard's unread entries (the oldest ``sample`` of each):
    every shard's state at once, one pipeline of reads, one query for the accounts."""
    targets = await reads.deployables(resources.reads)
    streams = {s: t["label"] for t in targets for s in _target(t).all_streams()}
    states = await queue_view.shard_states(resources.redis, list(streams))
    busy = [state for state in states.values() if state.exists and state.waiting]
    sampled = await queue_view.waiting_ids_of(resources.redis, busy, sample)
    everyone = [i for ids in sampled.values() for i in ids]
    owner: dict[str, str] = {}
    if everyone:
        async with resources.reads.connect() as conn:
            result = await conn.execute(
                text(
                    "SELECT p.id, a.name FROM predictions p JOIN accounts a "
                    "ON a.id = p.account_id WHERE p.id = ANY(CAST(:ids AS text[]))"
                ),
                {"ids": everyone},
            )
            owner = {prediction_id: name for prediction_id, name in result}
    shares: list[dict[str, Any]] = []
    for state in busy:
        ids = sampled.get(state.stream, [])
        if not ids:
            continue
        parsed = keys.parse_input_stream(state.stream)
        shares.append(
            {
                "label": streams[state.stream],
                "shard": parsed.shard if parsed else "?",
                "sampled": len(ids),
                "waiting": state.waiting,
                "accounts": Counter(owner.get(i, "?") for i in ids).most_common(),
            }
        )
    return shares


@dataclass(frozen=True, slots=True)
class Sharer:
    """An account with predictions waiting beside the heaviest's, on shards it shares."""

    account: str
    shards: list[int]
    waiting: int
    #: Every one of its shards is among the heaviest's: it waits for that flood.
    cornered: bool


@dataclass(frozen=True, slots=True)
class Collision:
    """A deployable's heaviest account and who shares its shards."""

    label: str
    target: str
    shards: int
    #: A given pair of accounts shares all of one's shards 1 time in this many.
    odds: int
    heaviest: str
    heaviest_shards: list[int]
    heaviest_waiting: int
    sharers: list[Sharer]


async def shard_collisions(resources: Resources) -> list[Collision]:
    """For each deployable with waiting predictions: its heaviest account, and the accounts
    waiting there whose shards (moves included: ``tracker.sharding``) overlap the heaviest's,
    those with all of them first (``conduit admin move-shards`` moves them)."""
    targets = {t["target"]: t for t in await reads.deployables(resources.reads)}
    rows = await reads.waiting_by_account(resources.reads, list(targets))
    by_target: dict[str, list[Any]] = {}
    for row in rows:
        by_target.setdefault(row["target"], []).append(row)
    found: list[Collision] = []
    moved = await asyncio.gather(  # every deployable's moves at once, not a round trip each
        *(sharding.read_moves(resources.redis, _target(targets[name])) for name in by_target)
    )
    for (name, waiting), moves in zip(by_target.items(), moved, strict=True):
        target = _target(targets[name])
        top = waiting[0]
        heavy = set(sharding.effective_shards(top["account_id"], target, moves))
        sharers = []
        for row in waiting[1:]:
            shards = sharding.effective_shards(row["account_id"], target, moves)
            if heavy & set(shards):
                cornered = set(shards) <= heavy
                sharers.append(Sharer(row["account"], shards, int(row["waiting"]), cornered))
        sharers.sort(key=lambda s: (not s.cornered, -s.waiting))
        found.append(
            Collision(
                targets[name]["label"],
                name,
                target.shards,
                sharding.collision_odds(target.shards),
                top["account"],
                sorted(heavy),
                int(top["waiting"]),
                sharers,
            )
        )
    return found
