"""End-to-end throughput of no-op predictions, against Celery, Dramatiq, taskiq and arq.

``.venv/bin/python -m bench.throughput [--count 5000 --repeats 3 --concurrency 32]``

Conduit: ``--count`` echo predictions (``n=1, delay=0``) created through one api by a
separate load-generator process (``--create-concurrency`` connections), each going
Postgres → stream → director → runner ``PUT`` → webhooks → terminal state committed. Measured
with one director and with two (each with its own echo runner, the sidecar layout), director
and runner concurrency ``--concurrency``. Rate = N / (first create sent → the last
``completed_at``, read from Postgres once every row is terminal); creation rate = N / (first
→ last ``created_at``).

Peers: the same N no-op tasks on the stack's Redis, enqueued by a separate process
(:mod:`bench.peers.enqueue`, 8 threads or tasks), each task ending with ``INCR bench:done``;
rate = N / (first enqueue → the counter reaching N, polled every 10 ms). Celery 5 with the
solo pool, Dramatiq with 8 threads, taskiq with taskiq-redis's stream broker, arq polling
every 10 ms; each library's other settings are its defaults.

Each system gets a warm-up batch, then ``--repeats`` timed batches; workers of one system are
stopped before the next starts, so idle workers do not take CPU from the one measured.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any, cast

import redis

from bench import loadgen
from bench.peers import DONE_KEY, WORKERS
from bench.report import Repeated, machine, ratio, table
from bench.stack import ROOT, BenchStack, running_stack
from tests.fixtures.processes import Proc
from tests.fixtures.waiting import wait_for

BODY = {"input": {"prompt": "bench", "n": 1, "delay": 0}}
TERMINAL = ("succeeded", "failed", "canceled", "aborted")
PEERS = ("celery", "dramatiq", "taskiq", "arq")
PEER_ENQUEUE_CONCURRENCY = 8
DEADLINE = 600.0


@dataclass
class Figures:
    rate: Repeated = field(default_factory=Repeated)
    creation: Repeated = field(default_factory=Repeated)
    failed: int = 0


# Conduit


def conduit_batch(
    stack: BenchStack,
    api: str,
    token: str,
    deployment: str,
    args: argparse.Namespace,
    n: int,
    body: dict[str, Any] = BODY,
) -> tuple[float, float, int]:
    """(predictions/s end to end, creations/s, rows not succeeded) for one batch of n of
    ``body``."""
    since = stack.query("SELECT now()")[0][0]
    url = f"{api}/v1/deployments/{deployment}/predictions"
    result = loadgen.spawn(
        url, body, {"Authorization": f"Bearer {token}"}, args.create_concurrency, count=n
    )
    if result["statuses"].get("201") != n:
        raise RuntimeError(f"creates answered {result['statuses']} ({result['errors']} errors)")

    def finished() -> list[tuple[Any, ...]] | None:
        rows = stack.query(
            "SELECT count(*) FILTER (WHERE status = ANY(%s)),"
            " count(*) FILTER (WHERE status <> 'succeeded'),"
            " extract(epoch FROM min(created_at)), extract(epoch FROM max(created_at)),"
            " extract(epoch FROM max(completed_at))"
            " FROM predictions WHERE deployment = %s AND created_at >= %s",
            (list(TERMINAL), deployment, since),
        )
        return rows if rows[0][0] >= n else None

    (_, not_succeeded, first_created, last_created, last_done), *_ = wait_for(
        finished, f"{n} terminal predictions", timeout=DEADLINE, interval=0.1
    )
    rate = n / (float(last_done) - result["first_sent"])
    creation = n / (float(last_created) - float(first_created))
    return rate, creation, int(not_succeeded)


def conduit_system(
    stack: BenchStack, api: str, token: str, directors: int, args: argparse.Namespace
) -> Figures:
    deployment = f"bench/throughput-{directors}"
    started: list[Proc] = []
    for index in range(directors):
        runner = stack.runner(concurrency=args.concurrency)
        started.append(stack.roles["runner"][-1])
        if index == 0:
            stack.deploy(deployment, runner, args.concurrency, director=False)
        started.append(stack.director(deployment, runner, args.concurrency))
    figures = Figures()
    try:
        conduit_batch(stack, api, token, deployment, args, args.warmup)
        for repeat in range(args.repeats):
            rate, creation, failed = conduit_batch(stack, api, token, deployment, args, args.count)
            figures.rate.add(rate)
            figures.creation.add(creation)
            figures.failed += failed
            print(
                f"  repeat {repeat + 1}: Conduit, {directors} director(s): {rate:,.0f}/s "
                f"(created at {creation:,.0f}/s)",
                flush=True,
            )
    finally:
        for proc in started:
            proc.stop()
    return figures


# Peers


def peer_enqueue(stack: BenchStack, peer: str, count: int) -> dict[str, Any]:
    argv = [sys.executable, "-m", "bench.peers.enqueue", peer, "--count", str(count)]
    argv += ["--concurrency", str(PEER_ENQUEUE_CONCURRENCY)]
    done = subprocess.run(
        argv, cwd=ROOT, env=stack.launcher.env, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"{peer} enqueue failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def done_count(counter: redis.Redis) -> int:
    return int(cast("bytes | None", counter.get(DONE_KEY)) or 0)


def peer_batch(stack: BenchStack, counter: redis.Redis, peer: str, n: int) -> tuple[float, float]:
    counter.set(DONE_KEY, 0)
    sent = peer_enqueue(stack, peer, n)
    wait_for(
        lambda: done_count(counter) >= n, f"{peer}: {n} tasks done", timeout=DEADLINE, interval=0.01
    )
    return n / (time.time() - sent["first"]), float(sent["rate"])


def peer_system(
    stack: BenchStack, counter: redis.Redis, peer: str, args: argparse.Namespace
) -> Figures:
    worker = stack.module(WORKERS[peer][0], f"peer-{peer}", WORKERS[peer][1:])
    figures = Figures()
    try:
        counter.set(DONE_KEY, 0)

        def ready() -> bool:  # taskiq reads only what is sent after its worker connected
            worker.check_alive()
            peer_enqueue(stack, peer, 1)
            return done_count(counter) > 0

        wait_for(ready, f"{peer} worker ready", timeout=60, interval=0.5)
        peer_batch(stack, counter, peer, args.warmup)
        for repeat in range(args.repeats):
            rate, enqueued = peer_batch(stack, counter, peer, args.count)
            figures.rate.add(rate)
            figures.creation.add(enqueued)
            print(
                f"  repeat {repeat + 1}: {peer}: {rate:,.0f}/s (enqueued at {enqueued:,.0f}/s)",
                flush=True,
            )
    finally:
        worker.stop()
    return figures


def report(results: dict[str, Figures], args: argparse.Namespace) -> str:
    conduit = results["Conduit, 1 director"].rate.median
    rows = [
        [
            name,
            f.rate.cell(0),
            f.creation.cell(0),
            ratio(conduit, f.rate.median),
            str(f.failed),
        ]
        for name, f in results.items()
    ]
    headers = ["System", "done/s (end to end)", "create/enqueue/s", "Conduit 1-dir ÷ this"]
    return "\n".join(
        [
            f"\nbench.throughput: N={args.count} no-op tasks per batch, warm-up {args.warmup}, "
            f"{args.repeats} repeats; director and runner concurrency {args.concurrency}, "
            f"{args.create_concurrency} create connections; median (min–max) over repeats",
            machine(),
            table([*headers, "not succeeded"], rows),
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.throughput", description=__doc__)
    parser.add_argument("--count", type=int, default=5000, help="tasks per timed batch (N)")
    parser.add_argument("--warmup", type=int, default=200, help="tasks in the warm-up batch")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=32, help="director and runner slots")
    parser.add_argument("--create-concurrency", type=int, default=32, help="create connections")
    parser.add_argument(
        "--peers", default=",".join(PEERS), help="comma-separated subset of " + ",".join(PEERS)
    )
    parser.add_argument(
        "--directors", default="1,2", help="comma-separated director counts to run (e.g. 1,2,4)"
    )
    args = parser.parse_args()
    began = time.monotonic()
    results: dict[str, Figures] = {}
    with running_stack() as stack:
        api = stack.api()
        token = stack.token()
        for directors in (int(n) for n in args.directors.split(",")):
            name = f"Conduit, {directors} director{'s' if directors > 1 else ''}"
            results[name] = conduit_system(stack, api, token, directors, args)
        counter = redis.Redis.from_url(stack.redis_url)
        for peer in filter(None, args.peers.split(",")):
            results[peer] = peer_system(stack, counter, peer, args)
    print(report(results, args))
    print(f"total run time {time.monotonic() - began:.0f} s")


if __name__ == "__main__":
    main()
