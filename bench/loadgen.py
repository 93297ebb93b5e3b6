"""A closed-loop HTTP load generator, run as its own process so it does not share a core's
event loop with the benchmark that reads its result.

``python -m bench.loadgen --url URL --body JSON [--header 'K: V'] --concurrency 50
(--seconds S [--warmup W] | --count N)`` keeps ``concurrency`` POSTs in flight (one aiohttp
session, keep-alive, on uvloop) and prints one JSON object: completed requests by status,
the timed window, latency percentiles of the timed requests, and the wall-clock times of the
first request sent and the last answer received.

With ``--seconds``, answers received during the first ``--warmup`` seconds or after the window
are not counted; with ``--count``, exactly N requests are sent in total and all are counted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from bench.report import quantile
from conduit.runtime import run_async

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Tally:
    statuses: Counter[int] = field(default_factory=Counter)
    latencies: list[float] = field(default_factory=list)
    errors: int = 0
    sent: int = 0
    first_sent: float | None = None
    last_done: float = 0.0


@dataclass(frozen=True)
class Plan:
    url: str
    body: bytes
    headers: dict[str, str]
    concurrency: int
    seconds: float | None
    warmup: float
    count: int | None


def _more(plan: Plan, tally: Tally, now: float, stop: float) -> bool:
    if plan.count is not None:
        return tally.sent < plan.count
    return now < stop


async def worker(
    session: aiohttp.ClientSession, plan: Plan, tally: Tally, window: tuple[float, float]
) -> None:
    start, stop = window
    while _more(plan, tally, now := time.perf_counter(), stop):
        tally.sent += 1
        if tally.first_sent is None:
            tally.first_sent = time.time()
        try:
            async with session.post(plan.url, data=plan.body, headers=plan.headers) as response:
                await response.read()
                status = response.status
        except aiohttp.ClientError:
            status = 0
        done = time.perf_counter()
        tally.last_done = time.time()
        if plan.count is None and not start <= done <= stop:
            continue  # answered during the warm-up or after the window
        if status == 0:
            tally.errors += 1
            continue
        tally.statuses[status] += 1
        tally.latencies.append((done - now) * 1000)


async def run(plan: Plan) -> dict[str, Any]:
    tally = Tally()
    connector = aiohttp.TCPConnector(limit=plan.concurrency, force_close=False)
    timeout = aiohttp.ClientTimeout(total=120)
    headers = {"Content-Type": "application/json", **plan.headers}
    async with aiohttp.ClientSession(
        connector=connector, timeout=timeout, headers=headers
    ) as session:
        began = time.perf_counter()
        start = began + plan.warmup
        stop = start + (plan.seconds or 0.0)
        await asyncio.gather(
            *(worker(session, plan, tally, (start, stop)) for _ in range(plan.concurrency))
        )
        ended = time.perf_counter()
    window = (plan.seconds or 0.0) if plan.count is None else ended - began
    ok = sum(n for status, n in tally.statuses.items() if 200 <= status < 300)
    return {
        "statuses": {str(k): v for k, v in tally.statuses.items()},
        "errors": tally.errors,
        "ok": ok,
        "window": window,
        "rate": ok / window if window else 0.0,
        "p50_ms": quantile(tally.latencies, 0.50),
        "p99_ms": quantile(tally.latencies, 0.99),
        "first_sent": tally.first_sent,
        "last_done": tally.last_done,
    }


def spawn(
    url: str,
    body: dict[str, Any],
    headers: dict[str, str],
    concurrency: int,
    *,
    seconds: float | None = None,
    warmup: float = 0.0,
    count: int | None = None,
) -> dict[str, Any]:
    """Run the load generator as a child process and return its result."""
    argv = [sys.executable, "-m", "bench.loadgen", "--url", url, "--body", json.dumps(body)]
    argv += ["--concurrency", str(concurrency)]
    for name, value in headers.items():
        argv += ["--header", f"{name}: {value}"]
    if count is not None:
        argv += ["--count", str(count)]
    else:
        argv += ["--seconds", str(seconds), "--warmup", str(warmup)]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"load generator failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.loadgen", description=__doc__)
    parser.add_argument("--url", required=True)
    parser.add_argument("--body", required=True, help="JSON request body")
    parser.add_argument("--header", action="append", default=[], help="'Name: value'")
    parser.add_argument("--concurrency", type=int, default=50)
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--seconds", type=float, help="timed window")
    mode.add_argument("--count", type=int, help="total requests")
    parser.add_argument("--warmup", type=float, default=0.0, help="seconds before the window")
    args = parser.parse_args()
    headers = dict(h.split(": ", 1) for h in args.header)
    plan = Plan(
        args.url,
        args.body.encode(),
        headers,
        args.concurrency,
        args.seconds,
        args.warmup if args.seconds else 0.0,
        args.count,
    )
    print(json.dumps(run_async(run(plan))))


if __name__ == "__main__":
    main()
