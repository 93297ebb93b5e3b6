"""Thousands of concurrent ``Prefer: wait`` creates on one api, on a throwaway local stack.

``.venv/bin/python -m bench.waiters`` from the repo root. An echo runner (256 slots) behind
deployment ``bench/echo`` with one director (concurrency 256) and one api. Two rounds of
``--clients`` (2,000) creates sent at once (echo ``n=1, delay=1``), each on a fresh api:

1. **Baseline**: without ``Prefer`` (each answered 201 ``starting`` at once), then every
   prediction waited for in Postgres: the same stored and run work, nobody waiting.
2. **Prefer: wait=60**: every client holds its request until its prediction is done.

Reported: answers by HTTP status and prediction status (zero 5xx expected), the api's RSS before
and at its peak during the round (per waiter: the growth over the number of clients), the
api's Redis connections at their peak (``CLIENT LIST``, names ``conduit-api*``), and for
succeeded predictions the p50/p99 of the answer's arrival after the prediction's
``completed_at``. See bench/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp
import redis.asyncio as aioredis

if __package__ in (None, ""):  # run as a script: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.stack import BenchStack, running_stack
from conduit.runtime import run_async

ECHO = "bench/echo"
INPUT = {"prompt": "w", "n": 1, "delay": 1}
SLOTS = 256


@dataclass
class Round:
    name: str
    codes: Counter[int] = field(default_factory=Counter)
    statuses: Counter[str] = field(default_factory=Counter)
    #: Answer received minus the prediction's completed_at, ms (succeeded answers only).
    after_end: list[float] = field(default_factory=list)
    rss_before: int = 0
    rss_peak: int = 0
    redis_peak: int = 0
    seconds: float = 0.0
    #: CPU seconds the api process spent in the round.
    cpu: float = 0.0


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss(pid: int) -> int:
    """Resident set size of ``pid`` in bytes (``VmRSS``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


async def api_connections(client: aioredis.Redis, others: set[str] | None = None) -> set[str]:
    """Addresses of api connections (names ``conduit-api*``), except ``others``."""
    clients = await client.client_list()
    return {
        c["addr"]
        for c in clients
        if str(c.get("name", "")).startswith("conduit-api") and c["addr"] not in (others or ())
    }


async def one(
    http: aiohttp.ClientSession, url: str, headers: dict[str, str], result: Round
) -> None:
    async with http.post(url, json={"input": INPUT}, headers=headers) as response:
        received = time.time()
        result.codes[response.status] += 1
        if response.status != 201:
            return
        body: dict[str, Any] = await response.json()
    result.statuses[body["status"]] += 1
    if body["status"] == "succeeded" and body.get("completed_at"):
        completed = datetime.fromisoformat(body["completed_at"]).timestamp()
        result.after_end.append((received - completed) * 1000)


async def watch(
    pid: int, redis_url: str, others: set[str], result: Round, done: asyncio.Event
) -> None:
    client = aioredis.Redis.from_url(redis_url, decode_responses=True)
    try:
        while not done.is_set():
            result.rss_peak = max(result.rss_peak, rss(pid))
            mine = await api_connections(client, others)
            result.redis_peak = max(result.redis_peak, len(mine))
            await asyncio.sleep(0.1)  # a sampling rate
    finally:
        await client.aclose()


async def settle(stack: BenchStack) -> None:
    """Until every stored prediction is terminal (the baseline's runs are over)."""
    while True:
        rows = await asyncio.to_thread(
            stack.query,
            "SELECT count(*) FROM predictions WHERE status NOT IN "
            "('succeeded', 'failed', 'canceled', 'aborted')",
        )
        if rows[0][0] == 0:
            return
        await asyncio.sleep(0.2)


async def run_round(
    stack: BenchStack,
    api_url: str,
    pid: int,
    others: set[str],
    token: str,
    clients: int,
    wait: bool,
) -> Round:
    result = Round("Prefer: wait=60" if wait else "no Prefer (baseline)")
    headers = {"Authorization": f"Bearer {token}"}
    if wait:
        headers["Prefer"] = "wait=60"
    url = f"{api_url}/v1/deployments/{ECHO}/predictions"
    result.rss_before = rss(pid)
    done = asyncio.Event()
    watcher = asyncio.create_task(watch(pid, stack.redis_url, others, result, done))
    cpu_before = cpu_seconds(pid)
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=120)
    began = time.monotonic()
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
        outcomes = await asyncio.gather(
            *(one(http, url, headers, result) for _ in range(clients)), return_exceptions=True
        )
    if not wait:
        await settle(stack)
    result.seconds = time.monotonic() - began
    result.cpu = cpu_seconds(pid) - cpu_before
    done.set()
    await watcher
    errors = Counter(type(o).__name__ for o in outcomes if isinstance(o, BaseException))
    for name, count in errors.items():
        result.codes[0] += count
        print(f"  {count} requests failed: {name}", file=sys.stderr)
    return result


async def measure(stack: BenchStack, clients: int) -> list[Round]:
    runner_url = stack.runner(concurrency=SLOTS)
    stack.deploy(ECHO, runner_url, concurrency=SLOTS)
    token = stack.token()
    rounds = []
    # Each round on a fresh api of its own, warmed up (pools, caches, the runner's slots), so
    # each RSS growth starts from the same place.
    for wait in (False, True):
        client = aioredis.Redis.from_url(stack.redis_url, decode_responses=True)
        others = await api_connections(client)  # earlier rounds' apis
        await client.aclose()
        api_url = stack.api()
        pid = stack.roles["api"][-1].popen.pid  # type: ignore[union-attr]
        await run_round(stack, api_url, pid, others, token, 50, wait=True)
        rounds.append(await run_round(stack, api_url, pid, others, token, clients, wait=wait))
    return rounds


def report(rounds: list[Round], clients: int) -> str:
    lines = [f"{clients} concurrent creates on one api (echo n=1 delay=1, {SLOTS} slots)", ""]
    for r in rounds:
        errors_5xx = sum(n for code, n in r.codes.items() if code >= 500 or code == 0)
        until = "terminal" if r.name.startswith("no") else "answered"
        lines.append(f"{r.name}: {r.seconds:.1f} s until all {until}")
        lines.append(f"  HTTP: {dict(sorted(r.codes.items()))}  5xx or failed: {errors_5xx}")
        lines.append(f"  status: {dict(sorted(r.statuses.items()))}")
        grown = max(r.rss_peak - r.rss_before, 0)
        lines.append(
            f"  api RSS {r.rss_before / 2**20:.1f} MiB before, {r.rss_peak / 2**20:.1f} MiB "
            f"peak: +{grown / 2**20:.1f} MiB, {grown / clients / 1024:.1f} KiB per client"
        )
        lines.append(f"  api Redis connections at peak: {r.redis_peak}; api CPU {r.cpu:.1f} s")
        if len(r.after_end) >= 2:
            cuts = statistics.quantiles(r.after_end, n=100, method="inclusive")
            lines.append(
                f"  answer after completed_at ({len(r.after_end)} succeeded): "
                f"p50 {cuts[49]:.1f} ms, p90 {cuts[89]:.1f} ms, p99 {cuts[98]:.1f} ms, "
                f"max {max(r.after_end):.1f} ms"
            )
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.waiters", description=__doc__)
    parser.add_argument("--clients", type=int, default=2000, help="concurrent creates per round")
    args = parser.parse_args()
    began = time.monotonic()
    with running_stack() as stack:
        rounds = run_async(measure(stack, args.clients))
    print(report(rounds, args.clients))
    print(f"total run time {time.monotonic() - began:.0f} s")


if __name__ == "__main__":
    main()
