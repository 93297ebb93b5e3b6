"""The event hub at 1 k, 5 k and 10 k waiters: its CPU and memory while they wait, and per
event delivered while their predictions end.

``.venv/bin/python -m bench.hub [--sizes 1000,5000,10000] [--rate 1000] [--idle 3]`` from
the repo root, on a throwaway Redis (:func:`conduit.services.local_services`). This process
holds one :class:`tracker.event_hub.EventHub` (as an api process does, ``block_ms`` 250) and
``size`` waiters, each a task reading its own prediction's events until ``done``, as a
``Prefer: wait`` create does. At each size:

1. **Waiting**: the process' RSS before and after subscribing (per waiter), and for ``--idle``
   seconds with nothing happening, the CPU of this process and of Redis (``INFO cpu``).
2. **Ending**: a second process appends each prediction's ``done`` event at ``--rate`` per
   second (in prediction order, through :class:`tracker.events.EventLog` as a director does:
   a script call each, which rings the doorbell), each carrying the wall-clock time it was
   sent. Until every waiter has its ``done``: this
   process' and Redis' CPU per event delivered, and the delay from append to the waiter's
   receipt (p50/p99).

The same appends with nobody waiting are the baseline of Redis' CPU (a size's streams cost
Redis that much whoever reads them).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import orjson
import redis.asyncio as aioredis

from conduit.services import local_services
from tracker.event_hub import EventHub
from tracker.events import EventType

PAGE = os.sysconf("SC_PAGE_SIZE")

#: The appender: the predictions' ``done`` events at a steady rate, each with its send time,
#: through the event log a director appends with (one script call each, ringing the doorbell).
APPENDER = """
import asyncio, sys, time, orjson
import redis.asyncio as aioredis
from tracker.events import EventLog, EventType
url, prefix, count, rate = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
async def main():
    client = aioredis.Redis.from_url(url)
    log = EventLog(client)
    started = time.perf_counter()
    for n in range(count):
        pause = started + n / rate - time.perf_counter()
        if pause > 0:
            await asyncio.sleep(pause)
        data = orjson.dumps({"sent": time.time()}).decode()
        await log.append(f"{prefix}{n:06d}", [(EventType.DONE, data)])
    await client.aclose()
asyncio.run(main())
"""


def rss() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * PAGE


async def redis_cpu(client: aioredis.Redis) -> float:
    info = await client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def prediction_id(size: int, n: int) -> str:
    return f"hub{size}x{n:06d}"


def append_all(url: str, size: int, rate: float) -> None:
    argv = [sys.executable, "-c", APPENDER, url, f"hub{size}x", str(size), str(rate)]
    subprocess.run(argv, check=True, cwd=Path(__file__).resolve().parent.parent)


async def wait_for_done(hub: EventHub, pid: str, delays: list[float]) -> None:
    sub = hub.subscribe(pid)
    assert sub is not None, "the hub refused a waiter"
    try:
        async for event in sub:
            if event.type is EventType.DONE:
                delays.append((time.time() - orjson.loads(event.data)["sent"]) * 1000)
                return
    finally:
        sub.close()


async def one_size(url: str, size: int, rate: float, idle: float) -> list[str]:
    client = aioredis.Redis.from_url(url)
    await client.flushdb()
    hub = EventHub.for_url(url, client, max_waiters=size, block_ms=250, client_name="bench-hub")
    hub.start()
    delays: list[float] = []
    try:
        before = rss()
        waiters = [
            asyncio.create_task(wait_for_done(hub, prediction_id(size, n), delays))
            for n in range(size)
        ]
        while hub.waiters < size:
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)  # the first read naming every stream
        per_waiter = (rss() - before) / size
        cpu, redis_before = time.process_time(), await redis_cpu(client)
        await asyncio.sleep(idle)
        idle_cpu = (time.process_time() - cpu) / idle
        idle_redis = (await redis_cpu(client) - redis_before) / idle
        cpu, redis_before, started = time.process_time(), await redis_cpu(client), time.time()
        await asyncio.to_thread(append_all, url, size, rate)
        await asyncio.gather(*waiters)
        elapsed = time.time() - started
        end_cpu = (time.process_time() - cpu) / size * 1e6
        end_redis = (await redis_cpu(client) - redis_before) / size * 1e6
    finally:
        await hub.close()
    # Baseline: the same appends, nobody reading them.
    await client.flushdb()
    redis_before = await redis_cpu(client)
    await asyncio.to_thread(append_all, url, size, rate)
    alone_redis = (await redis_cpu(client) - redis_before) / size * 1e6
    await client.flushdb()
    await client.aclose()
    delays.sort()
    return [
        f"{size:>7,}",
        f"{per_waiter / 1024:8.1f}",
        f"{idle_cpu:8.1%}",
        f"{idle_redis:8.1%}",
        f"{end_cpu:9.0f}",
        f"{end_redis:9.0f}",
        f"{alone_redis:9.0f}",
        f"{statistics.median(delays):8.2f}",
        f"{delays[int(len(delays) * 0.99) - 1]:8.2f}",
        f"{size / elapsed:8.0f}",
    ]


async def main(args: argparse.Namespace) -> None:
    sizes = [int(size) for size in args.sizes.split(",")]
    with local_services(database_url="postgresql://unused") as services:
        print(
            f"Event hub: waiters each on its own prediction, block_ms 250; done events appended"
            f" at {args.rate:,.0f}/s\n"
        )
        headers = (
            "waiters",
            "KiB/wait",
            "idle CPU",
            "idle Redis",
            "µs/event",
            "Redis µs",
            "alone µs",
            "p50 ms",
            "p99 ms",
            "ends/s",
        )
        widths = (7, 8, 8, 8, 9, 9, 9, 8, 8, 8)
        print(" ".join(f"{h:>{w}}" for h, w in zip(headers, widths, strict=True)))
        for size in sizes:
            print(" ".join(await one_size(services.redis_url, size, args.rate, args.idle)))
        print(
            "\nKiB/wait: this process' RSS growth per waiter; idle CPU / idle Redis: share of a"
            " core while they wait; µs/event: this process' CPU per done delivered; Redis µs:"
            " Redis' CPU per done appended and read; alone µs: the same appends with nobody"
            " waiting; p50/p99: append → waiter; ends/s: dones delivered per second."
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,5000,10000")
    parser.add_argument("--rate", type=float, default=1000.0)
    parser.add_argument("--idle", type=float, default=3.0)
    asyncio.run(main(parser.parse_args()))
