"""Start latency at low load: create → the model starts, and create → terminal, against Celery.

``.venv/bin/python -m bench.start_latency [--requests 200 --warmup 20 --repeats 3]``

Conduit: sequential ``POST /v1/deployments/bench/stamped/predictions`` with ``Prefer: wait``
(stamped echo, ``n=1, delay=0``; one director and one runner, 4 slots each). Per prediction:

- *create → runner start*: the output chunk's ``CLOCK_MONOTONIC`` stamp, taken the moment the
  model yields it (:mod:`bench.stamped_runner`; with ``delay=0`` that is the model's start),
  minus the client's ``time.monotonic()`` just before sending.
- *create → terminal committed*: the row's ``completed_at`` (Postgres ``now()`` of the terminal
  write's transaction) minus the client's wall clock just before sending.
- *create → response*: what the client sees with ``Prefer: wait``.

Baseline: Celery 5 (solo pool, Redis broker), sequential ``stamp.delay()``; the task
``RPUSH``es its start time (``time.time()``) and the client ``BLPOP``s it: *enqueue → task
start* is that time minus the client's wall clock before ``delay()``, *enqueue → observed
done* is the ``BLPOP`` return. Each repeat is a block of ``--requests`` per system, after
``--warmup`` untimed ones; the table gives the median (min–max) of each block's p50 and p99.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from types import ModuleType
from typing import cast

import httpx
import redis

from bench.peers import STARTS_KEY, WORKERS
from bench.report import Repeated, machine, quantile, ratio, table
from bench.stack import BenchStack, running_stack
from bench.stamped_runner import produced_at
from conduit.runtime import run_async
from tests.fixtures.waiting import wait_for

DEPLOYMENT = "bench/stamped"
BODY = {"input": {"prompt": "s", "n": 1, "delay": 0}}


@dataclass
class Row:
    p50: Repeated = field(default_factory=Repeated)
    p99: Repeated = field(default_factory=Repeated)

    def add(self, samples: Sequence[float]) -> None:
        self.p50.add(quantile(samples, 0.50))
        self.p99.add(quantile(samples, 0.99))


async def conduit_block(api: str, token: str, count: int) -> dict[str, list[float]]:
    headers = {"Authorization": f"Bearer {token}", "Prefer": "wait"}
    samples: dict[str, list[float]] = {"start": [], "terminal": [], "response": []}
    async with httpx.AsyncClient(base_url=api, headers=headers, timeout=60) as http:
        for _ in range(count):
            sent_wall, sent = time.time(), time.monotonic()
            response = await http.post(f"/v1/deployments/{DEPLOYMENT}/predictions", json=BODY)
            received = time.monotonic()
            body = response.json()
            if response.status_code != 201 or body["status"] != "succeeded":
                raise RuntimeError(f"api answered {response.status_code}: {response.text}")
            completed = datetime.fromisoformat(body["completed_at"]).timestamp()
            samples["start"].append((produced_at(body["output"][0]) - sent) * 1000)
            samples["terminal"].append((completed - sent_wall) * 1000)
            samples["response"].append((received - sent) * 1000)
    return samples


def celery_block(app: ModuleType, client: redis.Redis, count: int) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = {"start": [], "done": []}
    for _ in range(count):
        sent = time.time()
        app.stamp.delay()
        popped = cast("list[bytes] | None", client.blpop([STARTS_KEY], timeout=30))
        done = time.time()
        if popped is None:
            raise RuntimeError("celery task did not start within 30 s")
        samples["start"].append((float(popped[1]) - sent) * 1000)
        samples["done"].append((done - sent) * 1000)
    return samples


def start_conduit(stack: BenchStack) -> tuple[str, str]:
    runner = stack.stamped_runner()
    stack.deploy(DEPLOYMENT, runner)
    return stack.api(), stack.token()


def import_celery(stack: BenchStack) -> ModuleType:
    os.environ["REDIS_URL"] = stack.redis_url  # the app module reads its broker at import
    from bench.peers import celery_app

    return celery_app


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.start_latency", description=__doc__)
    parser.add_argument("--requests", type=int, default=200, help="sequential, per block")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    began = time.monotonic()
    rows = {
        name: Row()
        for name in (
            "Conduit: create → runner start",
            "Conduit: create → terminal committed",
            "Conduit: create → Prefer: wait response",
            "Celery: enqueue → task start (baseline)",
            "Celery: enqueue → done observed",
        )
    }
    names = list(rows)
    with running_stack() as stack:
        api, token = start_conduit(stack)
        stack.module(WORKERS["celery"][0], "peer-celery", WORKERS["celery"][1:])
        app = import_celery(stack)
        client = redis.Redis.from_url(stack.redis_url)

        def celery_ready() -> bool:
            return bool(celery_block(app, client, 1))

        wait_for(celery_ready, "celery worker ready", timeout=60)
        run_async(conduit_block(api, token, args.warmup))
        celery_block(app, client, args.warmup)
        for repeat in range(args.repeats):
            conduit = run_async(conduit_block(api, token, args.requests))
            celery = celery_block(app, client, args.requests)
            for name, samples in zip(
                names,
                [conduit["start"], conduit["terminal"], conduit["response"], *celery.values()],
                strict=True,
            ):
                rows[name].add(samples)
            print(
                f"  repeat {repeat + 1}: Conduit start p50 "
                f"{quantile(conduit['start'], 0.5):.2f} ms, Celery start p50 "
                f"{quantile(celery['start'], 0.5):.2f} ms",
                flush=True,
            )
    baseline = rows[names[3]].p50.median
    body = [
        [name, row.p50.cell(2), row.p99.cell(2), ratio(row.p50.median, baseline)]
        for name, row in rows.items()
    ]
    print(
        f"\nbench.start_latency: {args.requests} sequential predictions/tasks per block after "
        f"{args.warmup} warm-up, {args.repeats} repeats; ms, median (min–max) over repeats"
    )
    print(machine())
    print(table(["Path", "p50 ms", "p99 ms", "p50 ÷ Celery start p50"], body))
    print(f"total run time {time.monotonic() - began:.0f} s")


if __name__ == "__main__":
    main()
