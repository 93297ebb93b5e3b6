"""``conduit admin move-shards``: the operator's way out of a shuffle-sharding collision.

An account whose shards on a deployment are all among a flooder's waits for the flood (the
``/ops`` fairness page names such accounts). Moving it sends its new predictions to other
shards of that deployment (``tracker.sharding``): ``--away-from`` the flooder's, or the
``--shards`` named, or, with neither, shards apart from its own; ``--back`` undoes the move.
Entries queued before stay where they are and are read as before.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from conduit.runtime import database_url, run_async

if TYPE_CHECKING:
    from redis.asyncio import Redis

    from tracker.keys import Target


def cmd_move_shards(args: argparse.Namespace) -> None:
    from api.settings import ApiSettings
    from catalog import lookups
    from conduit.admin.names import split_name
    from tracker.db import make_engine
    from tracker.keys import Target
    from tracker.redis_connect import connect

    owner, name = split_name(args.deployment)

    async def main() -> str:
        engine = make_engine(database_url(), pool_size=1)
        try:
            deployment = await lookups.get_deployment(engine, owner, name)
            if deployment is None:
                raise SystemExit(f"conduit: deployment {args.deployment} does not exist")
            accounts = {n: await lookups.get_account(engine, n) for n in _named(args)}
        finally:
            await engine.dispose()
        missing = [n for n, found in accounts.items() if found is None]
        if missing:
            raise SystemExit(f"conduit: no account {', '.join(missing)}")
        ids = {n: found.id for n, found in accounts.items() if found is not None}
        target = Target.deployment(deployment.full_name, deployment.shards)
        redis = connect(ApiSettings().redis_url)
        try:
            return await _move(redis, target, args, ids)
        finally:
            await redis.aclose()

    print(run_async(main()))


async def _move(redis: Redis, target: Target, args: argparse.Namespace, ids: dict[str, int]) -> str:
    from tracker import sharding

    account = ids[args.account]
    moves = await sharding.read_moves(redis, target)
    before = sharding.effective_shards(account, target, moves)
    if args.back:
        await sharding.unmove(redis, target, account)
        moves.pop(account, None)
        chosen = sharding.effective_shards(account, target, moves)
    else:
        try:
            if args.shards:
                wanted = [int(s) for s in args.shards.split(",") if s.strip()]
            else:
                away = ids[args.away_from] if args.away_from else account
                avoid = sharding.effective_shards(away, target, moves)
                wanted = sharding.shards_apart(avoid, target.shards, f"{account}/{target.name}")
            chosen = await sharding.move(redis, target, account, wanted)
        except ValueError as error:
            raise SystemExit(f"conduit: {error}") from error
    return (
        f"{args.account} on {args.deployment}: shards {_listed(chosen)} (were {_listed(before)}) "
        f"of {target.shards}; entries queued before stay and are read as before"
    )


def _named(args: argparse.Namespace) -> list[str]:
    return [args.account, *([args.away_from] if args.away_from else [])]


def _listed(shards: list[int]) -> str:
    return ",".join(str(shard) for shard in shards)


def add_shards(admin_sub: Any) -> None:
    moved = admin_sub.add_parser(
        "move-shards",
        help="send an account's new predictions on a deployment to other shards of its queue "
        "(out of a flooder's way)",
    )
    moved.add_argument("account", metavar="ACCOUNT")
    moved.add_argument("--deployment", required=True, metavar="OWNER/NAME")
    how = moved.add_mutually_exclusive_group()
    how.add_argument(
        "--away-from", metavar="ACCOUNT", help="shards none of which this account's new ones use"
    )
    how.add_argument("--shards", metavar="N,N", help="these shards (0 to the deployment's - 1)")
    how.add_argument("--back", action="store_true", help="back to the account's own shards")
    moved.set_defaults(func=cmd_move_shards)
