"""The global gateway's costs: a step on another cluster against a local one, the request log
on against off, the log's write rate, and the quota's check per request.

``.venv/bin/python -m bench.gateway_global [--rounds 200]`` from the repo root. Stack: two
clusters on loopback (:mod:`tests.fixtures.two_clusters`: each its own Postgres database and
Redis database, an ``inspect`` runner with 4 slots, a director, a gateway with a cluster id),
plus two more gateways of the first cluster, one logging every call and one not. The client is
this process: one gRPC channel per gateway, sequential calls.

1. Cross-cluster: ``infer`` on a block of cluster-123 and on a block of cluster-456, both sent
   to cluster-123's gateway, interleaved round by round: p50/p99 and the difference (the second
   hop: gRPC to the other gateway, which runs the task on its own durable path).
2. The request log: the same block through the logging gateway and the plain one, interleaved:
   p50/p99 and the difference (what inference loses with the log on).
3. The log's write rate: 50,000 entries queued at once into a :class:`RequestLogWriter` on the
   stack's database; rows/s until all are written (COPY batches of 1,000).
4. The quota: 5,000 checks in a row of a :class:`gateway.quota.Quota` with per-second limits on
   every scope (gateway, account, session, block; never reached) against Redis, in one script
   call (one Redis) and in a call per scope (as on a Redis Cluster), against the same loop with
   no limit set (no Redis call): µs per check.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import grpc

from bench.stack import running_stack
from blocks.request_log import LogEntry
from core.ids import new_request_id
from gateway.proto.inference_pb2 import BlockInferencePacket
from gateway.proto.inference_pb2_grpc import BlockInferenceServiceStub
from gateway.quota import Quota, QuotaLimits
from gateway.request_log import RequestLogWriter
from tests.fixtures.processes import Launcher
from tests.fixtures.two_clusters import A_BLOCKS, B_BLOCKS, TwoClusters, two_clusters
from tracker.db import make_engine
from tracker.redis_connect import connect


def percentiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered), ordered[max(0, int(len(ordered) * 0.99) - 1)]


def line(name: str, samples: list[float]) -> str:
    p50, p99 = percentiles(samples)
    return f"  {name:<44} p50 {p50:7.2f} ms   p99 {p99:7.2f} ms"


async def interleaved(
    rounds: int, token: str, calls: dict[str, tuple[str, str]]
) -> dict[str, list[float]]:
    """``calls``: name → (address, block); sequential, the order swapped every round."""
    channels = {address: grpc.aio.insecure_channel(address) for address, _ in calls.values()}
    metadata = [("authorization", f"Bearer {token}")]
    samples: dict[str, list[float]] = {name: [] for name in calls}
    try:
        for n in range(rounds + 5):
            order = list(calls.items())
            if n % 2:
                order.reverse()
            for name, (address, block) in order:
                stub = BlockInferenceServiceStub(channels[address])
                packet = BlockInferencePacket(block_id=block, data=json.dumps({"n": n}))
                started = time.perf_counter()
                await stub.infer(packet, metadata=metadata, timeout=60)
                if n >= 5:  # warm-up rounds
                    samples[name].append((time.perf_counter() - started) * 1000)
    finally:
        for channel in channels.values():
            await channel.close()
    return samples


async def log_rate(database_url: str, entries: int) -> float:
    engine = make_engine(database_url, pool_size=2)
    writer = RequestLogWriter(engine, queue_size=entries, batch=1000, flush_interval=0.05)
    await writer.start()
    try:
        now = datetime.now(UTC)
        data = json.dumps({"messages": [{"role": "user", "content": "x" * 200}]}).encode()
        made = [
            LogEntry(
                new_request_id(),
                "bench",
                "blk-bench",
                n,
                now,
                b"",
                data,
                b"",
                b"",
                "OK",
                None,
                1.0,
                1,
            )
            for n in range(entries)
        ]
        started = time.perf_counter()
        for entry in made:
            writer.record(entry)
        while (writer.registry.get_sample_value("conduit_gateway_log_rows_total") or 0) < entries:
            await asyncio.sleep(0.01)
        return entries / (time.perf_counter() - started)
    finally:
        await writer.close()
        await engine.dispose()


async def quota_cost(redis_url: str, checks: int) -> list[float]:
    redis = connect(redis_url)
    try:
        limits = QuotaLimits(
            requests_per_second_total=10**9,
            requests_per_second_per_account=10**9,
            requests_per_second_per_session=10**9,
            requests_per_second_per_block_id=10**9,
        )
        costs = []
        per_scope = Quota(redis, lambda: limits)
        per_scope.one_call = False
        for quota in (Quota(redis, lambda: limits), per_scope, Quota(redis, lambda: None)):
            for _ in range(100):  # warm
                await quota.check(1, "s", "blk-bench")
            started = time.perf_counter()
            for n in range(checks):
                await quota.check(1, f"s{n % 50}", "blk-bench")
            costs.append((time.perf_counter() - started) / checks * 1e6)
        return costs
    finally:
        await redis.aclose()


def main(rounds: int) -> None:
    with running_stack() as stack, tempfile.TemporaryDirectory(prefix="conduit-b-") as logdir:
        with two_clusters(
            stack.launcher,
            stack.admin,
            stack.database_url,
            stack.database_url,
            stack.redis_url,
            Path(logdir),
        ) as world:
            run(world, stack.launcher, rounds, stack.database_url, stack.redis_url)


def run(
    world: TwoClusters, launcher: Launcher, rounds: int, database_url: str, redis_url: str
) -> None:
    token = world.user[1]
    print("1. a step on another cluster vs a local one (both through cluster-123's gateway)")
    samples = asyncio.run(
        interleaved(
            rounds,
            token,
            {
                "local block (cluster-123)": (world.a.address, A_BLOCKS[0]),
                "remote block (cluster-456)": (world.a.address, B_BLOCKS[0]),
            },
        )
    )
    for name, values in samples.items():
        print(line(name, values))
    local, remote = (percentiles(v)[0] for v in samples.values())
    print(f"  the second hop: +{remote - local:.2f} ms p50")

    print("2. inference with the request log on vs off (same block, separate gateways)")
    _, plain = launcher.gateway()
    _, logging_gateway = launcher.gateway(
        {"CONDUIT_GATEWAY_LOG": "true", "CONDUIT_GATEWAY_LOG_FLUSH_INTERVAL": "0.05"}
    )
    samples = asyncio.run(
        interleaved(
            rounds,
            token,
            {"log off": (plain, A_BLOCKS[0]), "log on": (logging_gateway, A_BLOCKS[0])},
        )
    )
    for name, values in samples.items():
        print(line(name, values))
    off, on = (percentiles(v)[0] for v in samples.values())
    print(f"  the log costs {on - off:+.2f} ms p50")

    print("3. the request log's write rate (COPY batches of 1,000)")
    rate = asyncio.run(log_rate(database_url, 50_000))
    print(f"  {rate:,.0f} rows/s")

    print("4. the quota's check (4 per-second scopes)")
    one_call, per_scope, unlimited = asyncio.run(quota_cost(redis_url, 5000))
    print(
        f"  {one_call:.0f} µs per check in one script call, {per_scope:.0f} µs in a call per"
        f" scope (a Redis Cluster's way), {unlimited:.1f} µs with no limit"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200)
    main(parser.parse_args().rounds)
