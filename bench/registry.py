"""The registry of inference servers at scale: filters, search and block lookups over 10,000
servers, each with published blocks, against a primary-key read of one record in the same run.

``.venv/bin/python -m bench.registry [--servers 10000] [--blocks 3] [--rounds 200]`` from the
repo root, on a throwaway Postgres (:func:`conduit.services.local_services`) and a fresh,
migrated database. Each server has a region (one of 20), a cluster id, 1–3 tags of 10, a GPU
flag, and ``--blocks`` published blocks whose metadata carries an algorithm type (one of 5)
and a model name; all servers are alive. Each figure is p50/p99 in ms of ``--rounds`` calls of
:mod:`blocks.inference_servers` (through SQLAlchemy's async engine, as the api and gateway call it),
the query's plan's first scan named beside it, so that an index is seen to be used.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from blocks import inference_servers
from blocks.mongo.filters import compile_filter
from conduit.runtime import migrate
from conduit.services import local_services
from tests.fixtures.servers import create_database
from tracker.db import make_engine


async def fill(engine: AsyncEngine, servers: int, blocks: int) -> None:
    async with engine.begin() as conn:
        await conn.execute(
            text(
                "INSERT INTO inference_servers (id, doc, heartbeat_at, heartbeat_grace)"
                " SELECT gen_random_uuid()::text, jsonb_build_object("
                " 'inference_server_name', 'server-' || n,"
                " 'inference_server_metadata', jsonb_build_object("
                "   'region', 'region-' || (n % 20), 'cluster_id', 'cluster-' || n,"
                "   'gpu_available', n % 3 = 0, 'rps', n % 1000),"
                " 'inference_server_tags', (SELECT jsonb_agg('tag-' || ((n + k) % 10))"
                "   FROM generate_series(0, n % 3) k),"
                " 'inference_server_public_url',"
                "   '10.0.' || (n / 256) || '.' || (n % 256) || '\\:50051'),"
                " now(), 3600 FROM generate_series(1, :servers) n"
            ),
            {"servers": servers},
        )
        await conn.execute(
            text(
                "INSERT INTO registry_blocks (server_id, block_id, metadata, public)"
                " SELECT s.id, 'blk-' || substr(md5(s.id || k), 1, 8),"
                " jsonb_build_object('component', jsonb_build_object('metadata',"
                "   jsonb_build_object('algorithmType', (ARRAY['llm','vision','asr','tts','embed'])"
                "     [1 + (abs(hashtext(s.id)) + k) % 5],"
                "   'model', (ARRAY['gpt-4o','llama-3','whisper','clip','bge'])"
                "     [1 + (abs(hashtext(s.id)) + k) % 5]))),"
                " true FROM inference_servers s, generate_series(1, :blocks) k"
            ),
            {"blocks": blocks},
        )
    async with engine.connect() as conn:
        autocommit = await conn.execution_options(isolation_level="AUTOCOMMIT")
        for table in ("inference_servers", "registry_blocks"):
            await autocommit.execute(text(f"VACUUM ANALYZE {table}"))


async def timed(rounds: int, call: Callable[[], Awaitable[Any]]) -> tuple[float, float, Any]:
    result = await call()  # warm
    samples = []
    for _ in range(rounds):
        started = time.perf_counter()
        result = await call()
        samples.append((time.perf_counter() - started) * 1000)
    samples.sort()
    return statistics.median(samples), samples[int(len(samples) * 0.99) - 1], result


async def first_scan(engine: AsyncEngine, sql: str, params: dict[str, Any]) -> str:
    async with engine.connect() as conn:
        plan = (await conn.execute(text(f"EXPLAIN {sql}"), params)).scalars().all()
    scans = [line.strip().lstrip("-> ") for line in plan if "Scan on" in line]
    return scans[0].split("  ")[0] if scans else plan[0]


async def main(servers: int, blocks: int, rounds: int) -> None:
    with local_services() as services:
        url = create_database(services.database_url, f"bench_registry_{uuid.uuid4().hex[:8]}")
        migrate(url)
        engine = make_engine(url, pool_size=2)
        try:
            started = time.perf_counter()
            await fill(engine, servers, blocks)
            print(
                f"{servers} servers, {servers * blocks} published blocks,"
                f" filled in {time.perf_counter() - started:.1f} s"
            )
            some = (await inference_servers.query(engine, {}, limit=1))[0]
            filters: dict[str, Any] = {
                "region equality": {"inference_server_metadata.region": "region-7"},
                "zone and GPU (seed)": {
                    "inference_server_metadata.region": "region-3",
                    "inference_server_metadata.gpu_available": True,
                },
                "tags $in (seed)": {"inference_server_tags": {"$in": ["tag-1", "tag-2"]}},
                "rps $gt": {"inference_server_metadata.rps": {"$gt": 990}},
                "name $regex": {"inference_server_name": {"$regex": "^server-99"}},
                "cluster id": {"inference_server_metadata.cluster_id": "cluster-4242"},
            }
            rows = [
                (
                    "get by id (baseline)",
                    *await timed(rounds, lambda: inference_servers.get(engine, some.id)),
                    "Index Scan pk",
                )
            ]
            for name, document in filters.items():
                condition = compile_filter(document, "s.doc", inference_servers.COLUMNS)
                scan = await first_scan(
                    engine,
                    f"SELECT s.id FROM inference_servers s WHERE {condition.text} LIMIT 100",
                    condition.params,
                )
                p50, p99, found = await timed(
                    rounds, lambda d=document: inference_servers.query(engine, d, limit=100)
                )
                rows.append((f"query: {name} ({len(found)} found)", p50, p99, found, scan))
            seed_blocks = {
                "$and": [
                    {"component.metadata.algorithmType": {"$eq": "llm"}},
                    {"component.metadata.model": {"$regex": "gpt"}},
                ]
            }
            for name, servers_filter in (
                (
                    "search: one cluster, seed blockQuery",
                    {"inference_server_metadata.cluster_id": {"$eq": "cluster-77"}},
                ),
                ("search: every cluster, seed blockQuery", {}),
            ):
                p50, p99, found = await timed(
                    rounds,
                    lambda f=servers_filter: inference_servers.search_blocks(
                        engine, f, seed_blocks, limit=100
                    ),
                )
                rows.append((f"{name} ({len(found)} found)", p50, p99, found, ""))
            async with engine.connect() as conn:
                block_id = (
                    await conn.execute(text("SELECT block_id FROM registry_blocks LIMIT 1"))
                ).scalar_one()
            p50, p99, _ = await timed(
                rounds, lambda: inference_servers.block_owner(engine, block_id)
            )
            rows.append(
                ("block owner lookup", p50, p99, None, "Index Scan ix_registry_blocks_block")
            )
            print(f"\n{'call':<58} {'p50 ms':>8} {'p99 ms':>8}  plan")
            for name, p50, p99, _found, scan in rows:
                print(f"{name:<58} {p50:8.2f} {p99:8.2f}  {scan}")
        finally:
            await engine.dispose()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", type=int, default=10_000)
    parser.add_argument("--blocks", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=200)
    args = parser.parse_args()
    asyncio.run(main(args.servers, args.blocks, args.rounds))
