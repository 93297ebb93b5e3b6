"""Fan-in fairness: many accounts on a few deployments, queue wait per account.

``.venv/bin/python -m bench.fanin [--count 1500 --repeats 3 --accounts 10 --deployments 3]``

Three echo deployments (each one runner and one director, 4 slots, echo ``n=1`` with
``--delay`` seconds of model time, so queues form). Ten accounts submit a mixed, shuffled
batch of ``--count`` creates through one api (32 connections): account 1 is a heavy hitter
with ``--heavy-share`` of all submissions, the other nine split the rest evenly; each account
sends half of its predictions to "its" deployment (index mod 3) and a quarter to each other
one. Once every prediction is terminal, the queue wait of each one is ``started_at −
created_at`` from Postgres (insert → the runner accepted it).

Reported per account: submissions, p50/p95/max queue wait; fairness spread = the largest
per-account p50 divided by the smallest, and the heavy account's p50 divided by the median
of the light accounts' p50s. There is no peer baseline here: the reference is an equal share
(spread 1.00).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time
from dataclasses import dataclass, field

import aiohttp

from bench.report import Repeated, machine, quantile, table
from bench.stack import BenchStack, running_stack
from conduit.runtime import run_async
from tests.fixtures.waiting import wait_for

CONNECTIONS = 32
DEADLINE = 900.0


@dataclass
class AccountFigures:
    submitted: Repeated = field(default_factory=Repeated)
    p50: Repeated = field(default_factory=Repeated)
    p95: Repeated = field(default_factory=Repeated)
    top: Repeated = field(default_factory=Repeated)


def plan(
    args: argparse.Namespace, tokens: list[str], deployments: list[str]
) -> list[tuple[str, str]]:
    """Shuffled (token, deployment) submissions for one batch."""
    heavy = round(args.count * args.heavy_share)
    light = (args.count - heavy) // (len(tokens) - 1)
    jobs: list[tuple[str, str]] = []
    for index, token in enumerate(tokens):
        own = deployments[index % len(deployments)]
        others = [d for d in deployments if d != own]
        weights = [0.5] + [0.5 / len(others)] * len(others)
        count = heavy if index == 0 else light
        jobs += [(token, d) for d in random.choices([own, *others], weights, k=count)]
    random.shuffle(jobs)
    return jobs


async def submit(api: str, jobs: list[tuple[str, str]], delay: float) -> None:
    body = {"input": {"prompt": "f", "n": 1, "delay": delay}}
    pending = list(reversed(jobs))
    connector = aiohttp.TCPConnector(limit=CONNECTIONS)
    async with aiohttp.ClientSession(connector=connector) as http:

        async def worker() -> None:
            while pending:
                token, deployment = pending.pop()
                url = f"{api}/v1/deployments/{deployment}/predictions"
                headers = {"Authorization": f"Bearer {token}"}
                async with http.post(url, json=body, headers=headers) as response:
                    if response.status != 201:
                        raise RuntimeError(f"create answered {response.status}")

        await asyncio.gather(*(worker() for _ in range(CONNECTIONS)))


def waits_by_account(stack: BenchStack, since: object, n: int) -> dict[int, list[float]]:
    def done() -> bool:
        rows = stack.query(
            "SELECT count(*) FROM predictions WHERE created_at >= %s AND completed_at IS NOT NULL",
            (since,),
        )
        return bool(rows[0][0] >= n)

    wait_for(done, f"{n} terminal predictions", timeout=DEADLINE, interval=0.2)
    rows = stack.query(
        "SELECT account_id, extract(epoch FROM started_at - created_at) * 1000"
        " FROM predictions WHERE created_at >= %s ORDER BY account_id",
        (since,),
    )
    waits: dict[int, list[float]] = {}
    for account, wait in rows:
        waits.setdefault(int(account), []).append(float(wait or 0.0))
    return waits


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.fanin", description=__doc__)
    parser.add_argument("--count", type=int, default=1500, help="predictions per batch")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--accounts", type=int, default=10)
    parser.add_argument("--deployments", type=int, default=3)
    parser.add_argument("--heavy-share", type=float, default=0.4, help="account 1's share")
    parser.add_argument("--delay", type=float, default=0.01, help="echo model time, seconds")
    parser.add_argument("--warmup", type=int, default=60, help="predictions in a warm-up batch")
    args = parser.parse_args()
    began = time.monotonic()
    names = [f"account {i + 1}{' (heavy)' if i == 0 else ''}" for i in range(args.accounts)]
    figures = {name: AccountFigures() for name in names}
    spread, heavy_vs_light = Repeated(), Repeated()
    with running_stack() as stack:
        deployments = [f"bench/fan-{i}" for i in range(args.deployments)]
        for deployment in deployments:
            stack.deploy(deployment, stack.runner())
        api = stack.api()
        tokens = [stack.token() for _ in range(args.accounts)]
        for repeat in range(args.repeats + 1):  # the first batch is the warm-up
            since = stack.query("SELECT now()")[0][0]
            n = args.warmup if repeat == 0 else args.count
            jobs = plan(argparse.Namespace(**{**vars(args), "count": n}), tokens, deployments)
            run_async(submit(api, jobs, args.delay))
            waits = waits_by_account(stack, since, len(jobs))
            if repeat == 0:
                continue
            medians = []
            for name, samples in zip(names, waits.values(), strict=True):
                medians.append(quantile(samples, 0.5))
                figures[name].submitted.add(len(samples))
                figures[name].p50.add(medians[-1])
                figures[name].p95.add(quantile(samples, 0.95))
                figures[name].top.add(max(samples))
            spread.add(max(medians) / min(medians))
            heavy_vs_light.add(medians[0] / statistics.median(medians[1:]))
            print(
                f"  repeat {repeat}: spread {spread.values[-1]:.2f}, "
                f"heavy ÷ light {heavy_vs_light.values[-1]:.2f}",
                flush=True,
            )
    rows = [
        [name, f.submitted.cell(0), f.p50.cell(0), f.p95.cell(0), f.top.cell(0)]
        for name, f in figures.items()
    ]
    print(
        f"\nbench.fanin: {args.accounts} accounts × {args.deployments} deployments, "
        f"{args.count} predictions per batch (account 1: {args.heavy_share:.0%}), echo delay "
        f"{args.delay:g} s, 4 slots per deployment, {args.repeats} repeats; queue wait "
        "created_at → started_at in ms, median (min–max) over repeats"
    )
    print(machine())
    print(table(["Account", "submitted", "p50", "p95", "max"], rows))
    print(f"fairness spread (max ÷ min of per-account p50): {spread.cell(2)}")
    print(f"heavy account p50 ÷ median light-account p50: {heavy_vs_light.cell(2)}")
    print(f"total run time {time.monotonic() - began:.0f} s")


if __name__ == "__main__":
    main()
