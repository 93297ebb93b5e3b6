"""Drills 12-15: the queue streams stay clean. Entries are acked and deleted after commit and
nothing is left pending; the director exports queue length and pending count; dead consumers
are removed from the group; a shard-count change (grow or shrink) loses nothing."""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import redis
from prometheus_client.parser import text_string_to_metric_families

from director.queue import GROUP, deployment_stream
from tests.faults.conftest import register_faulty
from tests.faults.harness import Drill, verify
from tests.fixtures.processes import Proc
from tests.fixtures.waiting import wait_for

QUICK = {"n": 1, "delay": 0.05}
CACHE_TTL = 5.0  # the api's CONDUIT_API_CACHE_TTL default


@contextmanager
def _redis(drill: Drill) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(drill.redis_url, decode_responses=True)
    try:
        yield client
    finally:
        client.close()


def _shards(name: str, shards: range) -> list[str]:
    return [deployment_stream(name, shard) for shard in shards]


def _lengths(drill: Drill, streams: list[str]) -> dict[str, int]:
    with _redis(drill) as r:
        return {stream: int(r.xlen(stream)) for stream in streams}


def _pending(r: redis.Redis, stream: str) -> int:
    if not r.exists(stream):
        return 0
    return int(r.xpending(stream, GROUP)["pending"])


def _dirty(drill: Drill, streams: list[str]) -> dict[str, tuple[int, int]]:
    """Streams still holding entries or pending ones: {stream: (length, pending)}."""
    with _redis(drill) as r:
        counts = {s: (int(r.xlen(s)), _pending(r, s)) for s in streams}
    return {s: c for s, c in counts.items() if c != (0, 0)}


def _queue_streams(drill: Drill) -> list[str]:
    with _redis(drill) as r:
        return sorted(r.scan_iter(match="input:prediction:*", _type="stream"))


def _consumers(r: redis.Redis, stream: str) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in r.xinfo_consumers(stream, GROUP)}


def _metrics_url(director: Proc) -> str:
    def found() -> str | None:
        director.check_alive()
        match = re.search(r"receiver (http://\S+)", director.log())
        return match.group(1) if match else None

    return wait_for(found, "director's receiver URL in its log", timeout=30) + "/metrics"


def _gauges(url: str, name: str) -> dict[str, float]:
    """One gauge's value per ``stream`` label, as the director exports it."""
    body = httpx.get(url, timeout=5).text
    for family in text_string_to_metric_families(body):
        if family.name == name:
            return {s.labels["stream"]: s.value for s in family.samples}
    return {}


def _quiet(drill: Drill, streams: list[str]) -> dict[str, tuple[int, int]] | None:
    return None if _dirty(drill, streams) else {"clean": (0, 0)}


def test_settled_load_leaves_every_stream_empty(drill: Drill) -> None:
    runners = [drill.launcher.runner("faulty", concurrency=4) for _ in range(2)]
    register_faulty(drill, runners[0][1])
    name = drill.deployment("hygiene", shards=4)
    for _, url in runners:
        drill.director(name, url, concurrency=4)
    accounts = drill.accounts(5)
    started = time.monotonic()
    drill.load(((accounts[i % 5], name, QUICK) for i in range(100)), workers=8)
    drill.settle(timeout=90)

    streams = _queue_streams(drill)
    assert set(_shards(name, range(4))) <= set(streams)
    # The ack (XACK + XDEL) follows the terminal commit; give the last ones a moment.
    wait_for(lambda: _quiet(drill, streams), "every queue stream empty, nothing pending", 10)
    with _redis(drill) as r:
        assert not list(r.scan_iter(match="dead:*")), "nothing was dead-lettered"
        added = sum(int(r.xinfo_stream(s)["entries-added"]) for s in _shards(name, range(4)))
        leftovers = {s: _consumers(r, s) for s in streams}
    # Every entry ever appended was delivered: nothing was trimmed away while pending (there is
    # no MAXLEN); the reconciler may add a harmless duplicate entry, never fewer.
    submitted = {s.id for s in drill.submitted}
    assert len(submitted) == 100
    assert added >= len(submitted)
    invoked = drill.invocations()
    assert set(invoked) == submitted, "every prediction created reached a runner"
    assert all(n == 1 for n in invoked.values()), invoked
    stale = {s: c for s, cs in leftovers.items() for c in cs.values() if c["pending"]}
    assert not stale, stale
    verify(drill, "12 100 predictions; streams empty after", started, note=f"{added} entries")


def test_director_exports_queue_length_and_pending(drill: Drill) -> None:
    (_, runner_url) = drill.launcher.runner("faulty", concurrency=1)
    register_faulty(drill, runner_url)
    name = drill.deployment("metrics", shards=2)
    [token] = drill.accounts(1)
    director = drill.director(name, runner_url, concurrency=1)
    url = _metrics_url(director)
    shards = _shards(name, range(2))

    def exported(kind: str) -> dict[str, float] | None:
        values = _gauges(url, f"conduit_queue_{kind}")
        return values if all(s in values for s in shards) else None

    wait_for(lambda: exported("length") and exported("pending"), "queue gauges exported", 10)
    started = time.monotonic()
    drill.load(((token, name, {"n": 1, "delay": 0.5}) for _ in range(12)), workers=4)

    def backlog() -> dict[str, float] | None:
        lengths = exported("length") or {}
        return lengths if all(lengths.get(s, 0) > 0 for s in shards) else None

    during = wait_for(backlog, "a backlog on both shards in the exported lengths", 10)
    pending = exported("pending") or {}
    # A director with one slot holds at most one entry: the backlog stays in the streams.
    assert sum(pending[s] for s in shards) <= 1, pending
    drill.settle(timeout=60)

    def drained() -> tuple[dict[str, float], dict[str, float]] | None:
        lengths, pending = exported("length") or {}, exported("pending") or {}
        zero = all(lengths.get(s) == 0 and pending.get(s) == 0 for s in shards)
        return (lengths, pending) if zero else None

    wait_for(drained, "exported length and pending back to 0", 10)
    assert not _dirty(drill, shards)
    peak = int(sum(during[s] for s in shards))
    verify(drill, "13 /metrics queue gauges follow a backlog", started, note=f"peak {peak}")


def test_dead_consumer_is_removed_after_ten_visibility_timeouts(drill: Drill) -> None:
    # Long enough that the survivor's own heartbeats keep it fresh on a loaded machine.
    visibility = 2.0
    (_, url_a), (_, url_b) = (drill.launcher.runner("faulty", concurrency=2) for _ in range(2))
    register_faulty(drill, url_a)
    name = drill.deployment("consumers", shards=2, max_attempts=2)
    [token] = drill.accounts(1)
    suffix = uuid.uuid4().hex[:6]
    doomed_id, survivor_id = f"doomed-{suffix}", f"survivor-{suffix}"
    settings = {"visibility_timeout": str(visibility)}
    doomed = drill.director(name, url_a, concurrency=2, id=doomed_id, **settings)
    _metrics_url(doomed)  # started and reading
    started = time.monotonic()
    # Long enough (20 s) to still be running when the doomed director dies on a loaded machine.
    ids = [drill.submit(token, name, {"n": 8, "delay": 2.5}) for _ in range(2)]
    assert all(ids)

    def running() -> bool:
        return all(state == "processing" for state, _, _ in drill.statuses().values())

    wait_for(running, "both predictions running on the doomed director", 15)
    shards = _shards(name, range(2))
    with _redis(drill) as r:
        held = {s: _consumers(r, s)[doomed_id]["pending"] for s in shards}
    held_streams = [s for s, n in held.items() if n]
    assert sum(held.values()) == 2, held
    survivor = drill.director(name, url_b, concurrency=2, id=survivor_id, **settings)
    _metrics_url(survivor)
    doomed.kill()
    killed_at = time.monotonic()
    with _redis(drill) as r:
        still_held = {s: _consumers(r, s)[doomed_id]["pending"] for s in shards}
    assert still_held == held, f"the doomed director finished its work before it died: {still_held}"

    def reclaimed() -> bool:
        with _redis(drill) as r:
            return all(_consumers(r, s).get(doomed_id, {}).get("pending", 0) == 0 for s in shards)

    wait_for(reclaimed, "the dead consumer's entries reclaimed", 10)
    reclaimed_after = time.monotonic() - killed_at
    with _redis(drill) as r:
        # Reclaimed, but not yet forgotten: a consumer is removed only after 10x the timeout.
        assert all(doomed_id in _consumers(r, s) for s in held_streams)

    streams = _queue_streams(drill)

    def forgotten() -> dict[str, float] | None:
        with _redis(drill) as r:
            if any(doomed_id in _consumers(r, s) for s in streams):
                return None
        return {"after": time.monotonic() - killed_at}

    gone = wait_for(forgotten, "the dead consumer removed everywhere", 10 * visibility + 10, 0.2)
    # Its heartbeat kept it fresh on the streams it held entries on until it died (its last
    # beat may lag its death by a few seconds on a loaded machine): long past the reclaim.
    assert gone["after"] >= 7 * visibility > reclaimed_after, gone
    with _redis(drill) as r:
        assert any(survivor_id in _consumers(r, s) for s in held_streams)
    verify(
        drill,
        "14 dead consumer forgotten after 10x visibility",
        started,
        note=f"reclaimed {reclaimed_after:.1f}s, removed {gone['after']:.1f}s after SIGKILL",
    )


def _submit_each(drill: Drill, tokens: list[str], name: str, count: int) -> None:
    drill.load(((tokens[i % len(tokens)], name, QUICK) for i in range(count)), workers=8)


def test_growing_shards_loses_nothing(drill: Drill) -> None:
    (_, runner_url) = drill.launcher.runner("faulty", concurrency=4)
    register_faulty(drill, runner_url)
    name = drill.deployment("grow", shards=2)
    tokens = drill.accounts(6)
    started = time.monotonic()
    _submit_each(drill, tokens, name, 40)
    old, new = _shards(name, range(2)), _shards(name, range(2, 4))
    assert sum(_lengths(drill, old).values()) == 40

    drill.admin.create_deployment(name, "drill/faulty", shards=4)
    probes = iter(range(10_000))

    def lands_in_new_shards() -> bool:
        # The api still uses its cached 2-shard layout for up to CACHE_TTL seconds.
        drill.submit(tokens[next(probes) % len(tokens)], name, QUICK)
        return sum(_lengths(drill, new).values()) > 0

    wait_for(lands_in_new_shards, "creates landing in shards 2..3", CACHE_TTL + 10, 0.5)
    _submit_each(drill, tokens, name, 40)
    assert sum(_lengths(drill, old + new).values()) == len(drill.submitted) >= 80

    director = drill.director(name, runner_url, concurrency=4, drain_shards="2")
    outcome = verify(drill, "15a shards 2 -> 4 with a backlog", started)
    wait_for(lambda: _quiet(drill, old + new), "all four shard streams empty", 10)
    assert outcome.statuses == {"succeeded": len(drill.submitted)}
    assert "drained; no longer read" not in director.log()  # shards 0..1 are still current


def test_shrinking_shards_drains_the_old_streams(drill: Drill) -> None:
    (_, runner_url) = drill.launcher.runner("faulty", concurrency=4)
    register_faulty(drill, runner_url)
    name = drill.deployment("shrink", shards=4)
    tokens = drill.accounts(8)
    started = time.monotonic()
    _submit_each(drill, tokens, name, 40)
    kept, retired = _shards(name, range(2)), _shards(name, range(2, 4))
    before = _lengths(drill, retired)
    assert sum(_lengths(drill, kept + retired).values()) == 40
    assert sum(before.values()) > 0, "the 4-shard layout used shards 2..3"

    drill.admin.create_deployment(name, "drill/faulty", shards=2)
    _, drill.api_url = drill.launcher.api()  # a fresh api: no cached 4-shard layout
    _submit_each(drill, tokens, name, 40)
    assert _lengths(drill, retired) == before, "new creates use only shards 0..1"
    assert sum(_lengths(drill, kept + retired).values()) == 80

    director = drill.director(name, runner_url, concurrency=4, drain_shards="4")
    outcome = verify(drill, "15b shards 4 -> 2, old shards drained", started)
    assert outcome.statuses == {"succeeded": 80}
    wait_for(lambda: _quiet(drill, kept + retired), "old and new shard streams empty", 10)

    def retired_logged() -> bool:
        log = director.log()
        return all(f"stream {s} drained; no longer read" in log for s in retired)

    wait_for(retired_logged, "the director retiring shards 2..3", 10)
    assert not any(f"stream {s} drained" in director.log() for s in kept)
