"""How costs grow with the data: the predictions table at 10 k, 100 k and 1 M rows, and Redis'
memory per idle deployment.

``.venv/bin/python -m bench.scale [--sizes 10000,100000,1000000] [--rounds 200]
[--deployments 10000] [--shards 8]`` from the repo root, on throwaway servers
(:func:`conduit.services.local_services`) and a fresh, migrated database.

1. **Rows.** One account owns every row; one row in ten is unfinished (``starting``: the
   backlog a claim has to find its row among), the rest succeeded. At each size, after
   ``VACUUM ANALYZE``, p50/p99 in ms of ``--rounds`` calls each, as the api and the director
   make them (:mod:`tracker.store`, :mod:`tracker.attempt_writes`, through SQLAlchemy's async
   engine): a GET by id, the account's newest page (101 rows, the api's page size + 1), a page
   10,000 rows deep by its cursor, and a claim of one queued prediction through the director's
   grouped writes (:class:`tracker.batch_writes.StateWrites`). Beside the claim, the baseline
   in the same run: the same statement without its primary-key condition
   (``p.id = ANY(:ids)``), as claims were written before it (the planner then hashes every
   unfinished row, or the whole table).
2. **Idle deployments.** ``--deployments`` deployments' ``--shards`` shard streams, each with
   the directors' consumer group and one consumer, empty, as a deployment nobody calls leaves
   them (:mod:`director.queue`, :mod:`tracker.keys`): Redis' ``used_memory`` before and after,
   per deployment.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
import redis.asyncio as aioredis
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from catalog import writes as catalog_writes
from conduit.runtime import migrate
from conduit.services import local_services
from director.queue import GROUP
from tests.fixtures.servers import create_database
from tracker import attempt_writes, keys, keyset, store
from tracker.batch_writes import _CLAIM, StateWrites
from tracker.db import autocommit, make_engine

SCHEMA = {"components": {"schemas": {"Input": {"type": "object", "properties": {}}}}}
#: The claim as it was written before it named its rows by primary key: the baseline.
_CLAIM_BY_JOIN_ONLY = text(str(_CLAIM).replace("p.id = ANY(CAST(:ids AS text[])) AND ", ""))
assert str(_CLAIM_BY_JOIN_ONLY) != str(_CLAIM), "the baseline must differ from the claim"


async def timed(rounds: int, call: Callable[[], Awaitable[Any]]) -> tuple[float, float]:
    await call()  # warm
    samples = []
    for _ in range(rounds):
        started = time.perf_counter()
        await call()
        samples.append((time.perf_counter() - started) * 1000)
    samples.sort()
    return statistics.median(samples), samples[max(0, int(len(samples) * 0.99) - 1)]


async def grow(engine: AsyncEngine, account_id: int, version: str, start: int, end: int) -> None:
    """Rows ``start`` to ``end`` (exclusive), one second apart in ``created_at``; one in ten
    ``starting``. Ids are ``bench-<n>``."""
    async with engine.begin() as conn:
        await conn.execute(
            text(
                "INSERT INTO predictions (id, account_id, model, version_id, input, output,"
                " status, created_at, started_at, completed_at, attempt, runs, target)"
                " SELECT 'bench-' || n, :account, 'bench/model', :version,"
                " jsonb_build_object('prompt', 'row ' || n), CASE WHEN n % 10 = 0 THEN NULL"
                " ELSE jsonb_build_array('out ' || n) END,"
                " CASE WHEN n % 10 = 0 THEN 'starting' ELSE 'succeeded' END,"
                " timestamptz '2026-01-01' + n * interval '1 second',"
                " CASE WHEN n % 10 = 0 THEN NULL"
                "   ELSE timestamptz '2026-01-01' + n * interval '1 second' END,"
                " CASE WHEN n % 10 = 0 THEN NULL"
                "   ELSE timestamptz '2026-01-01' + n * interval '1 second' END,"
                " CASE WHEN n % 10 = 0 THEN 0 ELSE 1 END, CASE WHEN n % 10 = 0 THEN 0 ELSE 1 END,"
                " :target"
                " FROM generate_series(:start, :end - 1) n"
            ),
            {
                "account": account_id,
                "version": version,
                "target": f"vp-{version}",
                "start": start,
                "end": end,
            },
        )
    async with engine.connect() as conn:
        done = await conn.execution_options(isolation_level="AUTOCOMMIT")
        await done.execute(text("VACUUM ANALYZE predictions"))


class Claimer:
    """Claims of queued rows, each row once: the ``starting`` rows are every tenth."""

    def __init__(self, size: int) -> None:
        self.queued = [f"bench-{n}" for n in range(0, size, 10)]
        random.shuffle(self.queued)

    def next_id(self) -> str:
        return self.queued.pop()


async def claim_by_join_only(engine: AsyncEngine, prediction_id: str) -> None:
    batch = orjson.dumps([{"id": prediction_id, "owner": "bench", "owners": ["bench"]}]).decode()
    async with autocommit(engine).connect() as conn:
        rows = (await conn.execute(_CLAIM_BY_JOIN_ONLY, {"batch": batch})).all()
    assert len(rows) == 1, prediction_id


async def rows_section(url: str, sizes: list[int], rounds: int) -> None:
    engine = make_engine(url, pool_size=2)
    try:
        account, _ = await catalog_writes.create_account(engine, "bench")
        version = await catalog_writes.create_version(engine, "bench", "model", SCHEMA, None)
        print(f"1. The predictions table ({rounds} calls each; one row in ten queued)")
        header = f"{'rows':>9} {'call':<44} {'p50 ms':>8} {'p99 ms':>8}"
        print(header)
        filled = 0
        for size in sizes:
            started = time.perf_counter()
            await grow(engine, account.id, version, filled, size)
            filled = size
            fill_s = time.perf_counter() - started
            ids = [f"bench-{n}" for n in random.sample(range(size), min(size, 5000))]
            deep_row = await store.get(engine, f"bench-{max(0, size - 10_001)}")
            assert deep_row is not None
            deep = keyset.PageKey(deep_row["created_at"], deep_row["id"])
            writes = StateWrites(engine)
            claimer = Claimer(size)

            async def claim(writes: StateWrites = writes, claimer: Claimer = claimer) -> None:
                assert await attempt_writes.claim(writes, claimer.next_id(), "bench") is not None

            async def claim_before(claimer: Claimer = claimer) -> None:
                await claim_by_join_only(engine, claimer.next_id())

            async def get(ids: list[str] = ids) -> None:
                assert await store.get(engine, random.choice(ids)) is not None

            async def newest() -> None:
                await store.list_for_account(engine, account.id, after=None, before=None, limit=101)

            async def deep_page(deep: keyset.PageKey = deep) -> None:
                await store.list_for_account(engine, account.id, after=deep, before=None, limit=101)

            calls: list[tuple[str, Callable[[], Awaitable[Any]]]] = [
                ("GET by id", get),
                ("list: newest page", newest),
                ("list: a page 10,000 rows deep", deep_page),
                ("claim (grouped writes, by primary key)", claim),
                ("baseline: claim joined to the batch only", claim_before),
            ]
            for name, call in calls:
                p50, p99 = await timed(rounds, call)
                print(f"{size:>9,} {name:<44} {p50:8.2f} {p99:8.2f}")
            print(f"{'':>9} (filled to {size:,} rows in {fill_s:.1f} s)")
    finally:
        await engine.dispose()


async def deployments_section(redis_url: str, deployments: int, shards: int) -> None:
    client = aioredis.Redis.from_url(redis_url)
    try:
        await client.flushdb()
        before = int((await client.info("memory"))["used_memory"])
        for start in range(0, deployments, 500):
            async with client.pipeline(transaction=False) as pipe:
                for n in range(start, min(deployments, start + 500)):
                    target = keys.Target.deployment(f"bench/idle-{n}", shards)
                    for stream in target.all_streams():
                        pipe.xgroup_create(stream, GROUP, id="$", mkstream=True)
                        pipe.xgroup_createconsumer(stream, GROUP, "director-1")
                await pipe.execute()
        after = int((await client.info("memory"))["used_memory"])
        per = (after - before) / deployments
        print(
            f"\n2. Idle deployments: {deployments:,} deployments × {shards} shard streams"
            f" (group and one consumer each)\n   Redis used_memory {before / 2**20:.1f} MiB →"
            f" {after / 2**20:.1f} MiB: {per / 1024:.1f} KiB per deployment,"
            f" {per / shards:.0f} bytes per stream"
        )
        await client.flushdb()
    finally:
        await client.aclose()


async def main(args: argparse.Namespace) -> None:
    sizes = sorted(int(size) for size in args.sizes.split(","))
    with local_services() as services:
        url = create_database(services.database_url, f"bench_scale_{uuid.uuid4().hex[:8]}")
        migrate(url)
        await rows_section(url, sizes, args.rounds)
        await deployments_section(services.redis_url, args.deployments, args.shards)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000,100000,1000000")
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--deployments", type=int, default=10_000)
    parser.add_argument("--shards", type=int, default=8)
    asyncio.run(main(parser.parse_args()))
