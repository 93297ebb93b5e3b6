"""Drill 11: shuffle sharding keeps a light account's wait short while another floods the queue.

A heavy account's flood waits in a deployment's queue (8 shards), then a light account creates
a few predictions; a director of 2 slots (as its runner) starts on that backlog. The figure is
the light account's wait relative to the drain: its p95 completion, counted from the director's
first pickup, as a fraction of the time the whole backlog takes to drain from then on. The flood
fills two shards and the light account one, so reading the shards in turn serves the light
account one turn in three: its predictions end among the first ~3 x LIGHT of the backlog (a
fraction near 3 x LIGHT / backlog). A read that follows the flood ends them with it (near 1), as
a single-shard deployment does by design: that is the control, which shows the figure can tell.

The light account's shards are chosen to share one of the heavy account's two (its creates go to
the other, the shorter), that one read after the flood's from the first shard on: disjoint sets
are the easy case, and identical ones (1 in 28 for 2 of 8) share a fate by design.
``bench/flood_fairness.py`` runs the live variant (the director already serving while the
flood is created) at a larger size.
"""

from __future__ import annotations

import time
import uuid

import psycopg

from core.ids import token_sha256
from tests.faults.conftest import register_faulty
from tests.faults.harness import Drill, verify
from tracker.keys import account_shards

WORK = {"n": 1, "delay": 0.05}
FLOOD = 200
LIGHT = 20
#: The control needs no large flood to show a light account behind it.
CONTROL_FLOOD = 60
SLOTS = 2
#: Above this the light account waited for most of the flood (in turn: about 0.25; following
#: the flood: about 1).
FAIR_AT_MOST = 0.5
#: The single-shard control's light account ends with the flood (about 0.99).
UNFAIR_AT_LEAST = 0.8


def account_id(database_url: str, token: str) -> int:
    with psycopg.connect(database_url) as conn:
        row = conn.execute(
            "SELECT account_id FROM api_tokens WHERE token_sha256 = %s", (token_sha256(token),)
        ).fetchone()
    assert row is not None
    return int(row[0])


def one_shared_shard_name(heavy: int, light: int, shards: int) -> str:
    """A deployment name on which the two accounts' shard sets share exactly one shard, and
    the light account's other shard (where its creates go) comes after both of the heavy
    account's in the streams' order: a read that keeps starting from the first shard, or
    takes the oldest entries first, reaches it only once the flood is gone."""
    for _ in range(1000):
        name = f"drill/sharded-{uuid.uuid4().hex[:6]}"
        a = set(account_shards(heavy, f"dp-{name}", shards))
        b = set(account_shards(light, f"dp-{name}", shards))
        if len(a & b) == 1 and min(b - a) > max(a):
            return name
    raise AssertionError("no deployment name gives the two accounts one shared shard")


def wait_relative_to_drain(database_url: str, deployment: str, light: list[str]) -> float:
    """The light predictions' p95 completion after the deployment's first start, as a
    fraction of its last completion after that start (Postgres's clock throughout)."""
    owner, _, name = deployment.partition("/")
    with psycopg.connect(database_url) as conn:
        row = conn.execute(
            "SELECT extract(epoch from min(p.started_at)), extract(epoch from max(p.completed_at))"
            " FROM predictions p JOIN deployments d ON d.id = p.deployment_id"
            " WHERE d.owner = %s AND d.name = %s",
            (owner, name),
        ).fetchone()
        ends = conn.execute(
            "SELECT extract(epoch from completed_at) FROM predictions WHERE id = ANY(%s)",
            (light,),
        ).fetchall()
    assert row is not None and row[0] is not None and len(ends) == len(light)
    first, last = float(row[0]), float(row[1])
    done = sorted(float(end) for (end,) in ends)
    p95 = done[max(0, int(len(done) * 0.95) - 1)]
    return (p95 - first) / (last - first)


def _backlog(drill: Drill, deployment: str, heavy: str, light: str, flood: int) -> list[str]:
    """The heavy account's flood, then the light account's creates; the light ones' ids."""
    drill.load(((heavy, deployment, WORK) for _ in range(flood)), workers=16)
    ids = [drill.submit(light, deployment, WORK) for _ in range(LIGHT)]
    assert all(ids)
    return [i for i in ids if i]


def test_shuffle_sharding_serves_a_light_account_beside_a_flood(drill: Drill) -> None:
    (_, sharded_runner), (_, single_runner) = (
        drill.launcher.runner("faulty", SLOTS) for _ in range(2)
    )
    register_faulty(drill, sharded_runner)
    heavy, light = drill.accounts(2)
    heavy_id, light_id = (account_id(drill.database_url, t) for t in (heavy, light))
    sharded = one_shared_shard_name(heavy_id, light_id, 8)
    drill.deploy(sharded, shards=8)
    single = drill.deployment("single", shards=1)
    started = time.monotonic()

    sharded_light = _backlog(drill, sharded, heavy, light, FLOOD)
    single_light = _backlog(drill, single, heavy, light, CONTROL_FLOOD)
    drill.director(sharded, sharded_runner, concurrency=SLOTS)
    drill.director(single, single_runner, concurrency=SLOTS)
    drill.settle(timeout=150)

    in_turn = wait_relative_to_drain(drill.database_url, sharded, sharded_light)
    control = wait_relative_to_drain(drill.database_url, single, single_light)
    verify(
        drill,
        f"11 fairness: {FLOOD} from A, then {LIGHT} from B",
        started,
        note=f"B p95 / drain: 8 shards {in_turn:.2f}, 1 shard {control:.2f}",
    )
    assert control >= UNFAIR_AT_LEAST, control
    assert in_turn <= FAIR_AT_MOST, in_turn
