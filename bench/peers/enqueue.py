"""Enqueue N no-op tasks to one peer from this process, then print when that happened.

``python -m bench.peers.enqueue PEER --count N --concurrency C``: C threads (Celery, Dramatiq:
their clients are synchronous) or C asyncio tasks (taskiq, arq) send the N tasks through the
library's own client. Prints JSON: wall-clock ``first`` (before the first send) and ``last``
(after the last send returned), and the enqueue ``rate``.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import inspect
import json
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, cast

from conduit.runtime import run_async


def send_sync(enqueue_one: Callable[[], None], count: int, concurrency: int) -> None:
    with ThreadPoolExecutor(concurrency) as pool:
        for future in [pool.submit(enqueue_one) for _ in range(count)]:
            future.result()


async def send_async(
    module: Any, enqueue_one: Callable[[], Awaitable[None]], count: int, concurrency: int
) -> None:
    startup = getattr(module, "startup", None)
    if startup is not None:
        await startup()
    left = count

    async def worker() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            await enqueue_one()

    await asyncio.gather(*(worker() for _ in range(concurrency)))


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.peers.enqueue", description=__doc__)
    parser.add_argument("peer", choices=["celery", "dramatiq", "taskiq", "arq"])
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args()
    module = importlib.import_module(f"bench.peers.{args.peer}_app")
    enqueue_one = module.enqueue_one
    first = time.time()
    if inspect.iscoroutinefunction(enqueue_one):
        run_async(send_async(module, enqueue_one, args.count, args.concurrency))
    else:
        send_sync(cast(Callable[[], None], enqueue_one), args.count, args.concurrency)
    last = time.time()
    rate = args.count / (last - first) if last > first else 0.0
    print(json.dumps({"first": first, "last": last, "rate": rate}))


if __name__ == "__main__":
    main()
