"""Soak: a steady create rate for many minutes; memory, connections and backlog per minute.

``.venv/bin/python -m bench.soak [--minutes 30 --rate 50]``

Stack: one api, deployment ``bench/echo`` with one echo runner and one director (8 slots),
and deployment ``bench/idle`` with its own runner and director that never get work. The bench
process creates echo predictions (``n=1, delay=0``) at ``--rate`` per second, open loop (a
slow answer does not delay the next create). At the start and then every ``--every`` seconds
it samples, with psutil, the RSS and the open TCP connections of the api, the echo director
and the echo runner, plus the backlog (rows not yet terminal) and the creates answered.

Pass/fail: growth of each series from the first sample after ``--warmup-minutes`` to the last
one; flat (pass) means below 10%. Idle CPU: the ``bench/idle`` director's CPU time over its
first ``--idle-seconds`` (60) after start, as a percentage of one core; it runs beside the
load, so the machine is busy while it is measured, but its own work is only its idle loop.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from dataclasses import dataclass, field

import aiohttp
import psutil

from bench.report import machine, quantile, table
from bench.stack import BenchStack, running_stack
from conduit.runtime import run_async

BODY = {"input": {"prompt": "soak", "n": 1, "delay": 0}}
SLOTS = 8
FLAT = 0.10


@dataclass
class Sample:
    minute: float
    rss_mb: dict[str, float]
    connections: dict[str, int]
    created: int
    failed_creates: int
    backlog: int
    create_p50_ms: float
    create_p99_ms: float


@dataclass
class Load:
    created: int = 0
    failed: int = 0
    latencies: list[float] = field(default_factory=list)


async def create_one(http: aiohttp.ClientSession, url: str, load: Load) -> None:
    sent = time.perf_counter()
    try:
        async with http.post(url, json=BODY) as response:
            await response.read()
            ok = response.status == 201
    except aiohttp.ClientError:
        ok = False
    load.latencies.append((time.perf_counter() - sent) * 1000)
    if ok:
        load.created += 1
    else:
        load.failed += 1


async def produce(url: str, token: str, rate: float, until: float, load: Load) -> None:
    headers = {"Authorization": f"Bearer {token}"}
    tasks: set[asyncio.Task[None]] = set()
    async with aiohttp.ClientSession(headers=headers) as http:
        start = time.monotonic()
        sent = 0
        while (now := time.monotonic()) < until:
            due = int((now - start) * rate) + 1
            for _ in range(due - sent):
                task = asyncio.create_task(create_one(http, url, load))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            sent = max(sent, due)
            await asyncio.sleep(max(0.0, start + sent / rate - time.monotonic()))
        await asyncio.gather(*tasks)


def sample(
    stack: BenchStack, watched: dict[str, psutil.Process], began: float, load: Load
) -> Sample:
    backlog = stack.query(
        "SELECT count(*) FROM predictions WHERE status IN ('starting', 'processing')"
    )[0][0]
    recent, load.latencies = load.latencies, []
    return Sample(
        minute=(time.monotonic() - began) / 60,
        rss_mb={name: p.memory_info().rss / 2**20 for name, p in watched.items()},
        connections={name: len(p.net_connections(kind="tcp")) for name, p in watched.items()},
        created=load.created,
        failed_creates=load.failed,
        backlog=int(backlog),
        create_p50_ms=quantile(recent, 0.5),
        create_p99_ms=quantile(recent, 0.99),
    )


async def soak(
    stack: BenchStack,
    url: str,
    token: str,
    watched: dict[str, psutil.Process],
    args: argparse.Namespace,
) -> list[Sample]:
    load = Load()
    began = time.monotonic()
    until = began + args.minutes * 60
    producer = asyncio.create_task(produce(url, token, args.rate, until, load))
    samples = [sample(stack, watched, began, load)]
    while time.monotonic() < until:
        await asyncio.sleep(min(args.every, max(0.0, until - time.monotonic())))
        samples.append(sample(stack, watched, began, load))
        print(f"  {describe(samples[-1])}", flush=True)
    await producer
    return samples


def describe(s: Sample) -> str:
    rss = ", ".join(f"{k} {v:.0f} MB" for k, v in s.rss_mb.items())
    return f"t={s.minute:.1f} min: {rss}; created {s.created}; backlog {s.backlog}"


def growth(first: float, last: float) -> str:
    change = (last - first) / first if first else 0.0
    return f"{change:+.1%} ({'flat' if abs(change) < FLAT else 'GROWING'})"


def report(samples: list[Sample], idle_cpu: float, args: argparse.Namespace) -> str:
    names = list(samples[0].rss_mb)
    rows = [
        [
            f"{s.minute:.1f}",
            *(f"{s.rss_mb[n]:.1f}" for n in names),
            *(str(s.connections[n]) for n in names),
            str(s.created),
            str(s.failed_creates),
            str(s.backlog),
            f"{s.create_p50_ms:.1f} / {s.create_p99_ms:.1f}",
        ]
        for s in samples
    ]
    headers = ["minute", *(f"{n} RSS MB" for n in names), *(f"{n} conns" for n in names)]
    headers += ["created", "failed", "backlog", "create p50/p99 ms"]
    after = [s for s in samples if s.minute >= args.warmup_minutes - 1e-6]
    base, last = after[0], samples[-1]
    lines = [
        f"\nbench.soak: {args.rate:g} creates/s for {args.minutes:g} min, "
        f"samples every {args.every:g} s",
        machine(),
        table(headers, rows),
        f"\nGrowth from t={base.minute:.1f} min (after warm-up) to t={last.minute:.1f} min "
        f"(flat = |growth| < {FLAT:.0%}):",
    ]
    for name in names:
        lines.append(
            f"  {name}: RSS {growth(base.rss_mb[name], last.rss_mb[name])}, "
            f"connections {base.connections[name]} → {last.connections[name]}"
        )
    achieved = last.created / (args.minutes * 60)
    lines.append(f"achieved create rate {achieved:.1f}/s; final backlog {last.backlog}")
    lines.append(
        f"idle director CPU over {args.idle_seconds:g} s: {idle_cpu:.2f}% of one core "
        "(measured while the load ran)"
    )
    return "\n".join(lines)


def start(stack: BenchStack) -> tuple[str, str, dict[str, psutil.Process], psutil.Process]:
    runner = stack.runner(concurrency=SLOTS)
    stack.deploy("bench/echo", runner, SLOTS)
    idle_runner = stack.runner()
    stack.deploy("bench/idle", idle_runner, SLOTS)
    api = stack.api()
    token = stack.token()

    def process(role: str, index: int) -> psutil.Process:
        popen = stack.roles[role][index].popen
        assert popen is not None
        return psutil.Process(popen.pid)

    watched = {"api": process("api", 0), "director": process("director", 0)}
    watched["runner"] = process("runner", 0)
    url = f"{api}/v1/deployments/bench/echo/predictions"
    return url, token, watched, process("director", 1)


async def measure_idle(director: psutil.Process, seconds: float) -> float:
    before = director.cpu_times()
    await asyncio.sleep(seconds)
    after = director.cpu_times()
    used = (after.user - before.user) + (after.system - before.system)
    return float(used / seconds * 100)


async def run(
    stack: BenchStack,
    url: str,
    token: str,
    watched: dict[str, psutil.Process],
    idle: psutil.Process,
    args: argparse.Namespace,
) -> tuple[list[Sample], float]:
    idle_task = asyncio.create_task(measure_idle(idle, args.idle_seconds))
    samples = await soak(stack, url, token, watched, args)
    return samples, await idle_task


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__)
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--rate", type=float, default=50.0, help="creates per second")
    parser.add_argument("--every", type=float, default=60.0, help="seconds between samples")
    parser.add_argument("--warmup-minutes", type=float, default=1.0)
    parser.add_argument("--idle-seconds", type=float, default=60.0)
    args = parser.parse_args()
    began = time.monotonic()
    with running_stack() as stack:
        url, token, watched, idle = start(stack)
        samples, idle_cpu = run_async(run(stack, url, token, watched, idle, args))
    print(report(samples, idle_cpu, args))
    print(f"total run time {time.monotonic() - began:.0f} s")


if __name__ == "__main__":
    main()
