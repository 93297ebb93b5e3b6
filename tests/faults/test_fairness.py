"""Drill 11: shuffle sharding keeps a quiet account's latency while another floods the queue."""

from __future__ import annotations

import time
import uuid

import psycopg

from tests.faults.conftest import register_faulty
from tests.faults.harness import Drill, verify
from tracker.ids import token_sha256
from tracker.keys import account_shards

WORK = {"n": 1, "delay": 0.2}  # 4 slots: 20/s, so a 500 flood is a 25 s backlog


def _p95_completion(drill: Drill, ids: list[str]) -> float:
    drill.settle(timeout=150)
    times = drill.completion_times(ids)
    return times[max(0, int(len(times) * 0.95) - 1)]


def _account_id(drill: Drill, token: str) -> int:
    with psycopg.connect(drill.database_url) as conn:
        row = conn.execute(
            "SELECT account_id FROM api_tokens WHERE token_sha256 = %s", (token_sha256(token),)
        ).fetchone()
    assert row is not None
    return int(row[0])


def _isolating_deployment(drill: Drill, flooder: str, quiet: str, shards: int) -> str:
    """A sharded deployment on which the two accounts' shard sets are disjoint.

    Shuffle sharding isolates accounts whose k-of-S shard sets differ; identical sets (1 in 28
    for k=2 of 8) share a fate by design. Names are random, so pick one the promise covers.
    """
    a, b = _account_id(drill, flooder), _account_id(drill, quiet)
    for _ in range(100):
        name = f"drill/sharded-{uuid.uuid4().hex[:6]}"
        key = f"dp-{name}"
        if not set(account_shards(a, key, shards)) & set(account_shards(b, key, shards)):
            drill.deploy(name, shards=shards)  # both accounts granted
            return name
    raise AssertionError("no deployment name separates the two accounts")


def _flood_then_quiet(drill: Drill, name: str, flooder: str, quiet: str) -> float:
    drill.load(((flooder, name, WORK) for _ in range(500)), workers=8)
    ids = [drill.submit(quiet, name, WORK) for _ in range(20)]
    return _p95_completion(drill, [i for i in ids if i])


def test_shuffle_sharding_isolates_a_flood(drill: Drill) -> None:
    (_, fair_runner), (_, unfair_runner) = (drill.launcher.runner("faulty", 4) for _ in range(2))
    register_faulty(drill, fair_runner)
    flooder, quiet = drill.accounts(2)
    sharded = _isolating_deployment(drill, flooder, quiet, shards=8)
    single = drill.deployment("single", shards=1)
    drill.director(sharded, fair_runner, concurrency=4)
    drill.director(single, unfair_runner, concurrency=4)
    started = time.monotonic()

    idle_ids = [drill.submit(quiet, sharded, WORK) for _ in range(20)]
    idle = _p95_completion(drill, [i for i in idle_ids if i])
    with_sharding = _flood_then_quiet(drill, sharded, flooder, quiet)
    without = _flood_then_quiet(drill, single, flooder, quiet)

    verify(
        drill,
        "11 fairness: 500 from A, then 20 from B",
        started,
        note=(
            f"B p95: idle {idle:.2f}s, flood+8 shards {with_sharding:.2f}s, "
            f"flood+1 shard {without:.2f}s"
        ),
    )
    assert with_sharding < without / 2
    assert with_sharding <= max(10 * idle, 2.0)
