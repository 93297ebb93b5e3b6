"""CPU per prediction, by process: where a no-op prediction's cost goes end to end.

``.venv/bin/python -m bench.cpu_cost [--count 2000 --repeats 3 --concurrency 16]`` from the
repo root. Stack (``bench.stack``): one api, one echo runner and one director with
``--concurrency`` slots, Redis and Postgres as throwaway servers. Each batch is
``bench.throughput``'s: ``--count`` echo predictions (``n=1, delay=0``) created through the api
by the load generator (32 connections) while the director drains them, until every row is
terminal. Around each batch the CPU time (user + system, from ``/proc``) of every process is
read: the api, the director, the runner, Redis (its ``INFO`` names its pid), Postgres (the
postmaster, the backends alive now, and those that ended, counted in the postmaster's
children's time), and the load generator (this process's reaped children). Printed: CPU µs
per prediction by process, median (min–max) over the repeats, its share of the total, and the
batch's end-to-end rate.

``--delay S`` makes the echo model take S seconds (a model that runs, rather than a no-op),
and ``--start-write-delay S`` sets the director's ``CONDUIT_DIRECTOR_START_WRITE_DELAY``: with
both, a run shorter than the delay has its start written with its end (the rows updated per
prediction show it).

Figures are CPU time, not wall time: a machine with other work running still gives the same
figures, give or take cache effects. The end-to-end rate is wall time and is not.
"""

from __future__ import annotations

import argparse
import os
import statistics
from pathlib import Path

import psycopg
import redis

from bench.stack import BenchStack, running_stack
from bench.throughput import conduit_batch

TICKS = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> list[str]:
    raw = Path(f"/proc/{pid}/stat").read_text()
    return raw[raw.rindex(")") + 2 :].split()


def cpu_seconds(pid: int, children: bool = True) -> float:
    """User + system seconds of ``pid`` (and of its children it has reaped)."""
    fields = _stat(pid)
    # After the command: state is field 3, so utime/stime/cutime/cstime are 14–17 → 11–14.
    ticks = int(fields[11]) + int(fields[12])
    if children:
        ticks += int(fields[13]) + int(fields[14])
    return ticks / TICKS


def children_of(parent: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int(_stat(int(entry.name))[1]) == parent:
                    found.append(int(entry.name))
            except (FileNotFoundError, ProcessLookupError, IndexError):
                continue
    return found


def postgres_seconds(postmaster: int) -> float:
    """The postmaster (with the backends that ended) and every backend alive now."""
    total = cpu_seconds(postmaster)
    for child in children_of(postmaster):
        try:
            total += cpu_seconds(child, children=False)
        except (FileNotFoundError, ProcessLookupError):
            continue
    return total


class Meters:
    def __init__(self, stack: BenchStack) -> None:
        self.pids = {role: procs[0].popen.pid for role, procs in stack.roles.items() if procs}  # type: ignore[union-attr]
        self.redis_url = stack.redis_url
        self.database_url = stack.database_url
        client = redis.Redis.from_url(stack.redis_url)
        self.redis_pid = int(client.info("server")["process_id"])
        client.close()
        with psycopg.connect(stack.database_url) as conn:
            data_dir = conn.execute("SHOW data_directory").fetchone()[0]  # type: ignore[index]
        self.postmaster = int(Path(data_dir, "postmaster.pid").read_text().split()[0])

    def commands(self) -> dict[str, float]:
        """Redis commands by name, and Postgres transactions and row writes, so far."""
        client = redis.Redis.from_url(self.redis_url)
        stats = client.info("commandstats")
        client.close()
        counts = {
            f"redis {name.removeprefix('cmdstat_')}": float(entry["calls"])
            for name, entry in stats.items()
        }
        with psycopg.connect(self.database_url) as conn:
            row = conn.execute(
                "SELECT xact_commit, tup_inserted, tup_updated, tup_deleted FROM pg_stat_database"
                " WHERE datname = current_database()"
            ).fetchone()
            hot = conn.execute(
                "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables"
                " WHERE relname = 'predictions'"
            ).fetchone()
        assert row is not None and hot is not None
        names = ("commits", "rows inserted", "rows updated", "rows deleted")
        for name, value in zip(names, row, strict=True):
            counts[f"postgres {name}"] = float(value)
        counts["postgres predictions updates"] = float(hot[0])
        counts["postgres predictions HOT updates"] = float(hot[1])
        return counts

    def read(self) -> dict[str, float]:
        figures = {role: cpu_seconds(pid) for role, pid in self.pids.items()}
        figures["redis"] = cpu_seconds(self.redis_pid)
        figures["postgres"] = postgres_seconds(self.postmaster)
        times = os.times()
        figures["load generator"] = times.children_user + times.children_system
        return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--create-concurrency", type=int, default=32)
    parser.add_argument(
        "--delay", type=float, default=0.0, help="seconds the echo model takes (default: none)"
    )
    parser.add_argument(
        "--start-write-delay",
        type=float,
        default=None,
        help="the director's CONDUIT_DIRECTOR_START_WRITE_DELAY (default: its own)",
    )
    args = parser.parse_args()
    body = {"input": {"prompt": "bench", "n": 1, "delay": args.delay}}
    settings = {}
    if args.start_write_delay is not None:
        settings["start_write_delay"] = str(args.start_write_delay)
    with running_stack() as stack:
        api = stack.api()
        runner = stack.runner(concurrency=args.concurrency)
        deployment = "bench/cpu"
        stack.deploy(deployment, runner, args.concurrency, director=False)
        stack.director(deployment, runner, args.concurrency, **settings)
        token = stack.token()
        meters = Meters(stack)
        conduit_batch(stack, api, token, deployment, args, args.warmup, body)
        per_prediction: dict[str, list[float]] = {}
        commands: dict[str, list[float]] = {}
        rates = []
        for repeat in range(args.repeats):
            counted = meters.commands()
            before = meters.read()
            rate, _, failed = conduit_batch(stack, api, token, deployment, args, args.count, body)
            after = meters.read()
            for name, value in meters.commands().items():
                per_command = (value - counted.get(name, 0.0)) / args.count
                commands.setdefault(name, []).append(per_command)
            rates.append(rate)
            for role in after:
                spent = (after[role] - before[role]) / args.count * 1e6
                per_prediction.setdefault(role, []).append(spent)
            print(f"  repeat {repeat + 1}: {rate:,.0f} predictions/s, {failed} not succeeded")
        medians = {role: statistics.median(v) for role, v in per_prediction.items()}
        total = sum(medians.values())
        model = f"echo taking {args.delay:g} s" if args.delay else "no-op"
        print(f"\nCPU per {model} prediction ({args.count} per batch, {args.repeats} batches)")
        print(f"{'process':<16} {'µs':>8}  {'(min–max)':<16} {'share':>6}")
        for role, values in sorted(per_prediction.items(), key=lambda kv: -medians[kv[0]]):
            spread = f"({min(values):.0f}–{max(values):.0f})"
            print(f"{role:<16} {medians[role]:8.0f}  {spread:<16} {medians[role] / total:6.1%}")
        print(f"{'total':<16} {total:8.0f}")
        rate = statistics.median(rates)
        print(f"\nend to end: {rate:,.0f} predictions/s ({min(rates):,.0f}–{max(rates):,.0f})")
        cores = os.cpu_count() or 1
        print(f"CPU bound at: {cores / (total / 1e6):,.0f} predictions/s on {cores} cores")
        print("\nRound trips and writes per prediction (median; the pg_stat counters lag a little)")
        for name, values in sorted(commands.items()):
            if statistics.median(values) >= 0.005:
                print(f"{name:<32} {statistics.median(values):8.3f}")


if __name__ == "__main__":
    main()
