"""``conduit admin fleet``: the runners the fleet registry knows, and ``op-token``, a signed
token for one runner lifecycle call."""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterable
from typing import Any

from redis.asyncio import Redis

from conduit.admin.running import with_redis
from conduit.admin.tables import table
from tracker.fleet import FleetEntry, read_fleet

FLEET_COLUMNS = ("ID", "DEPLOYMENT", "URL", "STATE", "CONCURRENCY", "HARDWARE", "HEARTBEAT")


def format_fleet(entries: Iterable[FleetEntry], now: float) -> str:
    """The fleet as a table, one runner a line, by deployment then URL; heartbeat age in
    seconds."""
    rows = [
        (
            entry.id,
            entry.deployment,
            entry.url,
            entry.state.value,
            str(entry.concurrency),
            entry.hardware,
            f"{entry.age(now):.1f}s ago",
        )
        for entry in sorted(entries, key=lambda e: (e.deployment, e.url))
    ]
    return table(FLEET_COLUMNS, rows)


async def fleet(redis: Redis) -> str:
    """``conduit admin fleet``: every runner the fleet registry knows, now."""
    entries = await read_fleet(redis)
    if not entries:
        return "no runners in the fleet"
    return format_fleet(entries.values(), time.time())


def cmd_fleet(args: argparse.Namespace) -> None:
    print(with_redis(fleet))


def cmd_op_token(args: argparse.Namespace) -> None:
    from runners.optokens import issue, read_key

    signers = [name.strip() for name in args.signers.split(",") if name.strip()]
    key = read_key(args.key_file)
    print(issue(key, args.operation, args.model, signers, runner_id=args.runner))


def add_fleet(admin_sub: Any) -> None:
    listed = admin_sub.add_parser(
        "fleet", help="list the runners of the fleet (REDIS_URL), with state and heartbeat age"
    )
    listed.set_defaults(func=cmd_fleet)
    op_token = admin_sub.add_parser(
        "op-token", help="mint a signed token for one runner lifecycle call"
    )
    op_token.add_argument(
        "--operation", required=True, choices=["model-load", "model-unload", "cache-flush"]
    )
    op_token.add_argument("--model", help="model id (omit for calls that name no model)")
    op_token.add_argument("--signers", required=True, metavar="NAME,NAME")
    op_token.add_argument("--key-file", required=True, help="the runner's op-token key")
    op_token.add_argument(
        "--runner",
        metavar="RUNNER_ID",
        help="accepted only by this runner (its runnerId in /v1/capabilities, CONDUIT_RUNNER_ID)",
    )
    op_token.set_defaults(func=cmd_op_token)
