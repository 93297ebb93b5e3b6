"""Shuffle sharding's odds and its remedy: how often an account shares all its shards with a
flooder, and the operator's move of an account to other shards of one deployable.

Each account's predictions go to ``SHARDS_PER_ACCOUNT`` of a deployable's shard streams
(:func:`tracker.keys.account_shards`, the shorter of them), so one account's flood fills only
those, and directors read every shard in turn. An account whose shards are all among a
flooder's waits for the flood: 1 time in C(S, k) for a given pair (:func:`collision_odds`). The
operator's way out is a move (``conduit admin move-shards``): the account's shards on that
deployable, chosen apart from the flooder's, kept in Redis (``tracker.keys.shard_moves_key``)
and applied by the enqueue script itself (``director.queue``), so new predictions go there at
once and cost no extra round trip. Entries queued before a move stay where they are and are
read as before: directors read all shards whatever the moves.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Iterable, Mapping, Sequence

from redis.asyncio import Redis

from tracker.keys import SHARDS_PER_ACCOUNT, Target, account_shards, shard_moves_key
from tracker.redis_connect import decoded


def collision_odds(shards: int, per_account: int = SHARDS_PER_ACCOUNT) -> int:
    """N of "1 time in N": how rarely a given account's shards are all among a given other
    account's (each with ``per_account`` of ``shards``), i.e. C(shards, per_account)."""
    if shards < 1:
        raise ValueError("a deployable has at least one shard")
    return math.comb(shards, min(per_account, shards))


def check_shards(chosen: Sequence[int], shards: int) -> list[int]:
    """``chosen`` sorted, or ValueError naming what is wrong: empty, repeated, or out of the
    deployable's ``0..shards-1``."""
    if not chosen:
        raise ValueError("shards: name at least one")
    if len(set(chosen)) != len(chosen):
        raise ValueError("shards: each at most once")
    wrong = [shard for shard in chosen if not 0 <= shard < shards]
    if wrong:
        raise ValueError(f"shards: {wrong} not among 0..{shards - 1}")
    return sorted(chosen)


def shards_apart(
    avoid: Iterable[int], shards: int, seed: str, per_account: int = SHARDS_PER_ACCOUNT
) -> list[int]:
    """``per_account`` shards none of which is in ``avoid`` (drawn by ``seed``,
    deterministically); ValueError when fewer are free."""
    free = sorted(set(range(shards)) - set(avoid))
    if len(free) < min(per_account, shards):
        raise ValueError(f"shards: only {len(free)} of {shards} are free of the other's")
    rng = random.Random(hashlib.sha256(seed.encode()).digest())
    return sorted(rng.sample(free, min(per_account, shards)))


def parse_moved(value: str | bytes) -> list[int]:
    return [int(shard) for shard in decoded(value).split(",") if shard]


def effective_shards(
    account_id: int, target: Target, moves: Mapping[int, Sequence[int]]
) -> list[int]:
    """The shards ``account_id``'s new predictions go to on ``target``: its move, else its own."""
    moved = moves.get(account_id)
    if moved:
        return sorted(moved)
    return account_shards(account_id, target.name, target.shards)


async def read_moves(redis: Redis, target: Target) -> dict[int, list[int]]:
    """The accounts moved on ``target``, with their shards (those out of range ignored)."""
    raw = await redis.hgetall(shard_moves_key(target.name))
    moves: dict[int, list[int]] = {}
    for account, value in raw.items():
        shards = [s for s in parse_moved(value) if 0 <= s < target.shards]
        if shards:
            moves[int(decoded(account))] = shards
    return moves


async def move(redis: Redis, target: Target, account_id: int, shards: Sequence[int]) -> list[int]:
    """Send ``account_id``'s new predictions on ``target`` to ``shards`` (checked)."""
    chosen = check_shards(shards, target.shards)
    value = ",".join(str(shard) for shard in chosen)
    await redis.hset(shard_moves_key(target.name), str(account_id), value)
    return chosen


async def unmove(redis: Redis, target: Target, account_id: int) -> bool:
    """Back to its own shards; False when it was not moved."""
    return bool(await redis.hdel(shard_moves_key(target.name), str(account_id)))
