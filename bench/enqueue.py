"""Create throughput of one api process against minimal FastAPI/Starlette endpoints.

``.venv/bin/python -m bench.enqueue [--seconds 10 --warmup 3 --repeats 3 --concurrency 50]``

Conduit: ``POST /v1/deployments/bench/echo/predictions`` (echo ``n=1, delay=0``) on one
``conduit api``. No director runs for ``bench/echo``, so nothing consumes the stream: the
figure is create (auth, resolve, validate, INSERT, enqueue script) alone. Baselines, each its
own uvicorn process with the same options (:mod:`bench.baselines.server`): (a) FastAPI + one
``XADD``; (b) FastAPI + ``INSERT ... RETURNING`` + ``XADD``; (c) raw Starlette, same work as
(b). The load generator (:mod:`bench.loadgen`) is a separate process with ``--concurrency``
connections kept busy; it counts 201s in a timed window after a warm-up. Targets are measured
in turn within each repeat, so drift on the shared machine hits all alike.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, field

from bench import loadgen
from bench.baselines.server import create_table
from bench.report import Repeated, machine, ratio, table
from bench.stack import BenchStack, running_stack
from core.ports import free_port
from tests.fixtures.processes import _healthy
from tests.fixtures.waiting import wait_for

DEPLOYMENT = "bench/echo"
BODY = {"input": {"prompt": "bench", "n": 1, "delay": 0}}
BASELINES = {
    "(a) FastAPI: XADD": "fastapi-xadd",
    "(b) FastAPI: INSERT + XADD": "fastapi-insert-xadd",
    "(c) Starlette: INSERT + XADD": "starlette-insert-xadd",
}
CONDUIT = "Conduit api: POST deployment prediction"
#: ``--costs``: the same api less one part at a time, to price each part.
NO_RATE_LIMIT = "Conduit api, create rate limit off"
STOCK_PROTOCOL = "Conduit api, stock HTTP protocol (no connection guard)"
NEITHER = "Conduit api, both off"
RATE_LIMIT_OFF = {"CONDUIT_API_CREATE_RATE_LIMIT": "off"}


@dataclass
class Figures:
    rate: Repeated = field(default_factory=Repeated)
    p50: Repeated = field(default_factory=Repeated)
    p99: Repeated = field(default_factory=Repeated)
    non_201: int = 0


@dataclass(frozen=True)
class Target:
    url: str
    headers: dict[str, str]


def _stock_api(stack: BenchStack, name: str, env: dict[str, str]) -> str:
    """:mod:`bench.baselines.stock_api` with ``env`` over the stack's environment."""
    port = free_port()
    proc = stack.module("bench.baselines.stock_api", name, ["--port", str(port)], env)
    url = f"http://127.0.0.1:{port}"
    wait_for(lambda: _healthy(proc, url), f"{name} healthy", timeout=30)
    return url


def start_targets(stack: BenchStack, costs: bool = False) -> dict[str, Target]:
    runner = stack.runner()
    stack.deploy(DEPLOYMENT, runner, director=False)
    targets = {}
    create_table(stack.database_url)
    for name, kind in BASELINES.items():
        port = free_port()
        proc = stack.module("bench.baselines.server", kind, [kind, "--port", str(port)])
        url = f"http://127.0.0.1:{port}"
        wait_for(lambda: _healthy(proc, url), f"{kind} healthy", timeout=30)  # noqa: B023
        targets[name] = Target(f"{url}/v1/predictions", {})
    api = stack.api()
    auth = {"Authorization": f"Bearer {stack.token()}"}
    path = f"/v1/deployments/{DEPLOYMENT}/predictions"
    targets[CONDUIT] = Target(api + path, auth)
    if costs:
        targets[NO_RATE_LIMIT] = Target(stack.api(RATE_LIMIT_OFF) + path, auth)
        targets[STOCK_PROTOCOL] = Target(_stock_api(stack, "stock-api", {}) + path, auth)
        targets[NEITHER] = Target(_stock_api(stack, "stock-api-open", RATE_LIMIT_OFF) + path, auth)
    return targets


def measure(targets: dict[str, Target], args: argparse.Namespace) -> dict[str, Figures]:
    figures = {name: Figures() for name in targets}
    for repeat in range(args.repeats):
        for name, target in targets.items():
            result = loadgen.spawn(
                target.url,
                BODY,
                target.headers,
                args.concurrency,
                seconds=args.seconds,
                warmup=args.warmup,
            )
            rate = result["statuses"].get("201", 0) / result["window"]
            figures[name].rate.add(rate)
            figures[name].p50.add(result["p50_ms"])
            figures[name].p99.add(result["p99_ms"])
            figures[name].non_201 += result["errors"] + sum(
                n for status, n in result["statuses"].items() if status != "201"
            )
            print(
                f"  repeat {repeat + 1}: {name}: {rate:,.0f}/s, "
                f"p50 {result['p50_ms']:.1f} ms, p99 {result['p99_ms']:.1f} ms",
                flush=True,
            )
    return figures


def report(figures: dict[str, Figures], args: argparse.Namespace) -> str:
    conduit = figures[CONDUIT].rate.median
    rows = [
        [
            name,
            f.rate.cell(0),
            f.p50.cell(1),
            f.p99.cell(1),
            ratio(conduit, f.rate.median) if name != CONDUIT else "-",
            str(f.non_201),
        ]
        for name, f in figures.items()
    ]
    headers = ["Target", "201/s", "p50 ms", "p99 ms", "Conduit ÷ this", "non-201"]
    return "\n".join(
        [
            f"\nbench.enqueue: {args.concurrency} concurrent clients, {args.seconds:g} s timed "
            f"after {args.warmup:g} s warm-up, {args.repeats} repeats; "
            "median (min–max) over repeats",
            machine(),
            table(headers, rows),
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.enqueue", description=__doc__)
    parser.add_argument("--seconds", type=float, default=10.0, help="timed window per run")
    parser.add_argument("--warmup", type=float, default=3.0, help="untimed seconds per run")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=50, help="concurrent clients")
    parser.add_argument(
        "--costs",
        action="store_true",
        help="also measure the api with the create rate limit off, on uvicorn's stock "
        "protocol (no connection guard), and with both off",
    )
    args = parser.parse_args()
    began = time.monotonic()
    with running_stack() as stack:
        figures = measure(start_targets(stack, args.costs), args)
    print(report(figures, args))
    print(f"total run time {time.monotonic() - began:.0f} s")


if __name__ == "__main__":
    main()
