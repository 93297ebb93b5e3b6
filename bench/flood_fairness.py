"""A light account beside a flood: its p95 completion against the flood's drain.

``.venv/bin/python -m bench.flood_fairness [--flood 300 --light 20 --delay 0.05 --repeats 3]``

One echo deployment of 8 shards, one director of 2 slots on an echo runner of 2 slots, serving
while the creates arrive. A heavy account creates ``--flood`` predictions (32 connections),
then a light account creates ``--light`` one after another. The light account's shards share
one of the heavy account's two, and the other one (where its creates go) is read after the
flood's from the first shard on (as in the fault drill ``tests/faults/test_fairness.py``,
which runs the same load on a backlog, at a CI size).

Reported per repeat (each on a fresh deployment): the light account's p95 completion
(create → terminal), the drain (the flood's first create → the last terminal write), their
ratio, and the light account's p95 counted from its first create as a fraction of what was
left of the drain then. Shards read in turn end the light account's predictions well before
the flood's; a read that follows the flood ends them with it (ratio near 1).
"""

from __future__ import annotations

import argparse
import asyncio

import aiohttp
import redis

from bench.report import Repeated, machine, quantile
from bench.stack import BenchStack, running_stack
from conduit.runtime import run_async
from tests.faults.test_fairness import account_id, one_shared_shard_name
from tests.fixtures.waiting import wait_for

CONNECTIONS = 32
SLOTS = 2
MODEL = "bench/echo"


def blocked_readers(redis_url: str) -> int:
    """Connections blocked in XREADGROUP: directors waiting for work."""
    with redis.Redis.from_url(redis_url) as client:
        clients = client.client_list()
    return sum(1 for c in clients if c.get("cmd") == "xreadgroup" and "b" in c.get("flags", ""))


async def create(api: str, token: str, deployment: str, count: int, delay: float) -> list[str]:
    """``count`` creates over CONNECTIONS connections (one at a time when count is small)."""
    body = {"input": {"prompt": "f", "n": 1, "delay": delay}}
    url = f"{api}/v1/deployments/{deployment}/predictions"
    headers = {"Authorization": f"Bearer {token}"}
    ids: list[str] = []
    left = [count]

    async def worker(http: aiohttp.ClientSession) -> None:
        while left[0] > 0:
            left[0] -= 1
            async with http.post(url, json=body, headers=headers) as response:
                if response.status != 201:
                    raise RuntimeError(f"create answered {response.status}")
                ids.append((await response.json())["id"])

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=CONNECTIONS)) as http:
        await asyncio.gather(*(worker(http) for _ in range(min(count, CONNECTIONS))))
    return ids


def one_run(
    stack: BenchStack, api: str, runner: str, args: argparse.Namespace
) -> tuple[float, float]:
    """(light p95 / drain, light p95 / drain left at its first create) of one fresh run."""
    heavy, light = stack.token(), stack.token()
    heavy_id, light_id = (account_id(stack.database_url, t) for t in (heavy, light))
    name = one_shared_shard_name(heavy_id, light_id, 8)
    stack.admin.create_deployment(name, MODEL, shards=8, visibility="public")
    waiting = blocked_readers(stack.redis_url)
    stack.director(name, runner, SLOTS)
    # The director's start stays outside the figures.
    wait_for(lambda: blocked_readers(stack.redis_url) > waiting, "the director reads", 60)
    flood = run_async(create(api, heavy, name, args.flood, args.delay))
    light_ids = [run_async(create(api, light, name, 1, args.delay))[0] for _ in range(args.light)]
    everything = flood + light_ids

    def done() -> bool:
        rows = stack.query(
            "SELECT count(*) FROM predictions WHERE id = ANY(%s) AND completed_at IS NOT NULL",
            (everything,),
        )
        return bool(rows[0][0] == len(everything))

    wait_for(done, "every prediction terminal", timeout=900, interval=0.2)
    [(began, last)] = stack.query(
        "SELECT extract(epoch from min(created_at)), extract(epoch from max(completed_at))"
        " FROM predictions WHERE id = ANY(%s)",
        (everything,),
    )
    rows = stack.query(
        "SELECT extract(epoch from created_at), extract(epoch from completed_at)"
        " FROM predictions WHERE id = ANY(%s)",
        (light_ids,),
    )
    waits = [float(end) - float(start) for start, end in rows]
    p95 = quantile(waits, 0.95)
    drain = float(last) - float(began)
    light_began = min(float(start) for start, _ in rows)
    left = float(last) - light_began
    print(
        f"  light p95 {p95:.2f}s, drain {drain:.2f}s: {p95 / drain:.2f} of the drain, "
        f"{p95 / left:.2f} of what was left of it ({left:.2f}s)"
    )
    return p95 / drain, p95 / left


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.flood_fairness", description=__doc__)
    parser.add_argument("--flood", type=int, default=300)
    parser.add_argument("--light", type=int, default=20)
    parser.add_argument("--delay", type=float, default=0.05, help="echo model time, seconds")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    of_drain, of_left = Repeated(), Repeated()
    with running_stack() as stack:
        api = stack.api()
        runner = stack.runner(SLOTS)
        stack.admin.create_model(MODEL, runner)
        for _ in range(args.repeats):
            whole, left = one_run(stack, api, runner, args)
            of_drain.add(whole)
            of_left.add(left)
    print(
        f"light account p95 / drain: {of_drain.cell(2)}; "
        f"/ drain left at its first create: {of_left.cell(2)}"
    )
    print(machine())


if __name__ == "__main__":
    main()
