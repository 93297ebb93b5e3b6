"""The synchronous lane (``/run``) on a throwaway local stack.

``.venv/bin/python -m bench.run_lane`` from the repo root:

1. Overhead at low load: sequential calls, interleaved round by round, of the echo runner
   directly (Cog's synchronous ``POST /predictions``), of ``POST /v1/deployments/bench/echo/run``
   and of today's ``POST .../predictions`` with ``Prefer: wait``; p50/p90/p99 side by side.
2. Overload: the runner's capacity measured first (closed loop, one client per slot, called
   directly), then an open-loop load of 3× that capacity on ``/run`` for 10 s: goodput (runs
   answered 200 within the window, per second) against capacity, and how fast the refusals
   (429 ``out_of_capacity``) come back. The same load then goes to an api whose lane has an
   unbounded queue (a huge ``queue_factor`` and TTL), in the same run.

The two apis run one after the other (the second starts when the first has left the lane's
membership): each holds all of the runner's permits in its turn.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import httpx

if __package__ in (None, ""):  # run as a script: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.report import machine, quantile
from bench.stack import BenchStack, running_stack
from conduit.runtime import run_async
from tests.fixtures.processes import RUNNER_AUTH
from tests.fixtures.waiting import wait_for

ECHO = "bench/echo"
SLOTS = 4
FAST_INPUT = {"prompt": "bench", "n": 1, "delay": 0}
TARGET_MS = 1.0
UNBOUNDED = {"CONDUIT_API_LANE_QUEUE_FACTOR": "1000000", "CONDUIT_API_LANE_QUEUE_TTL": "3600"}


@dataclass(frozen=True)
class Options:
    requests: int
    warmup: int
    delay: float
    seconds: float
    factor: float


def ms(seconds: float) -> float:
    return seconds * 1000


def latency_table(title: str, rows: Sequence[tuple[str, Sequence[float]]]) -> str:
    width = max(len(name) for name, _ in rows) + 2
    lines = [title, f"{'':<{width}}{'n':>6}{'p50':>9}{'p90':>9}{'p99':>9}{'max':>9}  (ms)"]
    for name, samples in rows:
        cuts = [quantile(samples, q) for q in (0.5, 0.9, 0.99)] + [max(samples, default=0)]
        lines.append(f"{name:<{width}}{len(samples):>6}" + "".join(f"{v:>9.2f}" for v in cuts))
    return "\n".join(lines)


# 1. Overhead at low load


@dataclass
class Overhead:
    direct: list[float] = field(default_factory=list)
    run: list[float] = field(default_factory=list)
    wait: list[float] = field(default_factory=list)


async def _timed(call: Any) -> tuple[float, httpx.Response]:
    start = time.perf_counter()
    response = await call
    return ms(time.perf_counter() - start), response


async def overhead(
    http: httpx.AsyncClient,
    runner_url: str,
    api_url: str,
    token: str,
    options: Options,
    *,
    wait: bool = True,
) -> Overhead:
    """Rounds of direct, ``/run`` and (with ``wait``) ``Prefer: wait``. A ``Prefer: wait``
    prediction leaves work behind it (the director's and the api's writes, its stream) that
    overlaps the next round's calls; without ``wait`` the direct and ``/run`` calls have the
    stack to themselves."""
    auth = {"Authorization": f"Bearer {token}"}
    run_url = f"{api_url}/v1/deployments/{ECHO}/run"
    wait_url = f"{api_url}/v1/deployments/{ECHO}/predictions"
    results = Overhead()
    for i in range(options.warmup + options.requests):
        direct_ms, direct = await _timed(
            http.post(
                f"{runner_url}/predictions",
                json={"id": f"bench-{uuid.uuid4().hex}", "input": FAST_INPUT},
                headers=RUNNER_AUTH,
            )
        )
        run_ms, run = await _timed(http.post(run_url, json={"input": FAST_INPUT}, headers=auth))
        checks = [(direct, 200), (run, 200)]
        if wait:
            wait_ms, answer = await _timed(
                http.post(wait_url, json={"input": FAST_INPUT}, headers={**auth, "Prefer": "wait"})
            )
            checks.append((answer, 201))
        for response, ok in checks:
            if response.status_code != ok or response.json()["status"] != "succeeded":
                raise RuntimeError(
                    f"{response.url} answered {response.status_code}: {response.text}"
                )
        if i >= options.warmup:
            results.direct.append(direct_ms)
            results.run.append(run_ms)
            if wait:
                results.wait.append(wait_ms)
    return results


# 2. Overload


async def capacity(session: aiohttp.ClientSession, runner_url: str, options: Options) -> float:
    """Runs per second the runner completes with every slot busy (called directly)."""
    input = {"prompt": "cap", "n": 1, "delay": options.delay}
    done = 0
    end = time.perf_counter() + min(options.seconds, 5.0)

    async def client() -> None:
        nonlocal done
        while time.perf_counter() < end:
            body = {"id": f"cap-{uuid.uuid4().hex}", "input": input}
            async with session.post(
                f"{runner_url}/predictions", json=body, headers=RUNNER_AUTH
            ) as response:
                await response.read()
                if response.status == 200:
                    done += 1

    began = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(SLOTS)))
    return done / (time.perf_counter() - began)


@dataclass
class Overload:
    offered: int = 0
    ok: list[float] = field(default_factory=list)
    ok_in_window: int = 0
    refused: list[float] = field(default_factory=list)
    other: dict[str, int] = field(default_factory=dict)
    retry_after: list[int] = field(default_factory=list)


async def overload(
    session: aiohttp.ClientSession, api_url: str, token: str, rate: float, options: Options
) -> Overload:
    """Open loop: one request every 1/rate s for the window, each on its own."""
    url = f"{api_url}/v1/deployments/{ECHO}/run"
    body = {"input": {"prompt": "load", "n": 1, "delay": options.delay}}
    headers = {"Authorization": f"Bearer {token}"}
    result = Overload()
    began = time.perf_counter()
    window_end = began + options.seconds

    async def one() -> None:
        start = time.perf_counter()
        try:
            async with session.post(url, json=body, headers=headers) as response:
                await response.read()
                status = response.status
                retry_after = response.headers.get("Retry-After")
        except (aiohttp.ClientError, TimeoutError) as error:
            kind = type(error).__name__
            result.other[kind] = result.other.get(kind, 0) + 1
            return
        end = time.perf_counter()
        if status == 200:
            result.ok.append(ms(end - start))
            result.ok_in_window += end <= window_end
        elif status == 429:
            result.refused.append(ms(end - start))
            if retry_after is not None:
                result.retry_after.append(int(retry_after))
        else:
            result.other[str(status)] = result.other.get(str(status), 0) + 1

    tasks = []
    while (now := time.perf_counter()) < window_end:
        tasks.append(asyncio.create_task(one()))
        result.offered += 1
        await asyncio.sleep(max(0.0, began + result.offered / rate - now))
    await asyncio.gather(*tasks)
    return result


@dataclass
class Results:
    overhead: Overhead
    pairs: Overhead
    capacity: float
    rate: float
    bounded: Overload
    unbounded: Overload


async def measure(stack: BenchStack, runner_url: str, token: str, options: Options) -> Results:
    api_url = _lane_api(stack, {})
    limits = httpx.Limits(max_keepalive_connections=4)
    async with httpx.AsyncClient(timeout=60, limits=limits) as http:
        low = await overhead(http, runner_url, api_url, token, options)
        pairs = await overhead(http, runner_url, api_url, token, options, wait=False)
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        cap = await capacity(session, runner_url, options)
        rate = options.factor * cap
        bounded = await overload(session, api_url, token, rate, options)
        stack.roles["api"][-1].stop()
        unbounded_url = _lane_api(stack, UNBOUNDED)
        unbounded = await overload(session, unbounded_url, token, rate, options)
    return Results(low, pairs, cap, rate, bounded, unbounded)


def _lane_api(stack: BenchStack, env: dict[str, str]) -> str:
    """An api whose lane holds all of the runner's permits, once it does."""
    proc, url = stack.launcher.api(env)
    stack.roles.setdefault("api", []).append(proc)

    def ready() -> bool:
        text = httpx.get(f"{url}/metrics", timeout=10).text
        permits = sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("lane_permits{") and f'deployment="{ECHO}"' in line
        )
        return permits == SLOTS

    wait_for(ready, "the lane holding every permit of the runner", timeout=60)
    return url


def report(results: Results, options: Options) -> str:
    low, pairs = results.overhead, results.pairs
    p50 = {name: quantile(samples, 0.5) for name, samples in vars(low).items()}
    lines = [
        latency_table(
            f"1. Overhead, sequential, echo n=1 delay=0 ({options.requests} each, interleaved)",
            [
                ("runner direct (POST /predictions)", low.direct),
                ("/run", low.run),
                ("Prefer: wait", low.wait),
            ],
        ),
        f"/run p50 - direct p50: {p50['run'] - p50['direct']:+.2f} ms "
        f"(target ≤ +{TARGET_MS:.0f} ms); Prefer: wait: {p50['wait'] - p50['direct']:+.2f} ms",
        "",
        latency_table(
            f"1b. The same without Prefer: wait ({options.requests} direct and /run pairs)",
            [("runner direct (POST /predictions)", pairs.direct), ("/run", pairs.run)],
        ),
        f"/run p50 - direct p50: {quantile(pairs.run, 0.5) - quantile(pairs.direct, 0.5):+.2f} ms "
        f"(target ≤ +{TARGET_MS:.0f} ms)",
        "",
        f"2. Overload: echo delay={options.delay} s on {SLOTS} slots; capacity "
        f"{results.capacity:.1f} runs/s (direct, closed loop); offered {results.rate:.1f}/s "
        f"({options.factor:g}×) for {options.seconds:g} s",
    ]
    header = (
        f"{'':<16}{'offered':>8}{'200':>6}{'goodput/s':>10}{'of cap':>8}{'429':>6}"
        f"{'429 p50':>9}{'429 p99':>9}{'200 p50':>9}{'200 p99':>9}{'other':>8}"
    )
    lines.append(header)
    for name, load in (("bounded", results.bounded), ("unbounded queue", results.unbounded)):
        goodput = load.ok_in_window / options.seconds
        cells = [
            f"{load.offered:>8}",
            f"{len(load.ok):>6}",
            f"{goodput:>10.1f}",
            f"{goodput / results.capacity:>8.0%}",
            f"{len(load.refused):>6}",
            f"{quantile(load.refused, 0.5):>9.2f}",
            f"{quantile(load.refused, 0.99):>9.2f}",
            f"{quantile(load.ok, 0.5):>9.0f}",
            f"{quantile(load.ok, 0.99):>9.0f}",
            f"{sum(load.other.values()):>8}",
        ]
        lines.append(f"{name:<16}" + "".join(cells))
    if results.bounded.retry_after:
        advice = results.bounded.retry_after
        lines.append(f"Retry-After on 429s: {min(advice)}–{max(advice)} s")
    lines += [
        "(goodput: 200s answered within the window; latencies in ms; the unbounded queue's "
        "200s include those answered after the window)",
        "",
        machine(),
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.run_lane", description=__doc__)
    parser.add_argument("--requests", type=int, default=200, help="timed calls per path")
    parser.add_argument("--warmup", type=int, default=20, help="untimed rounds first")
    parser.add_argument("--delay", type=float, default=0.2, help="echo delay under overload (s)")
    parser.add_argument("--seconds", type=float, default=10.0, help="overload window (s)")
    parser.add_argument("--factor", type=float, default=3.0, help="offered load / capacity")
    args = parser.parse_args()
    options = Options(args.requests, args.warmup, args.delay, args.seconds, args.factor)
    began = time.monotonic()
    with running_stack() as stack:
        runner_url = stack.runner(SLOTS)
        stack.deploy(ECHO, runner_url, SLOTS)
        token = stack.token()
        results = run_async(measure(stack, runner_url, token, options))
    print(report(results, options))
    print(f"\ntotal run time {time.monotonic() - began:.0f} s")


if __name__ == "__main__":
    main()
