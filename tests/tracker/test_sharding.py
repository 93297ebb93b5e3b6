"""Shuffle sharding's odds and the operator's move, as pure functions."""

from __future__ import annotations

import pytest

from tracker import sharding
from tracker.keys import DEFAULT_SHARDS, SHARDS_PER_ACCOUNT, Target, account_shards


def test_collision_odds_are_one_in_c_of_shards_and_rarer_by_default() -> None:
    assert sharding.collision_odds(8, 2) == 28  # the former default
    assert sharding.collision_odds(DEFAULT_SHARDS, SHARDS_PER_ACCOUNT) == 120
    assert sharding.collision_odds(1) == 1  # one shard: everyone shares it
    with pytest.raises(ValueError):
        sharding.collision_odds(0)


def test_collision_odds_match_the_hash() -> None:
    # How often a light account's shards are all among a given flooder's, over many accounts.
    name = "dp-acme/sdxl"
    flooder = set(account_shards(1, name, DEFAULT_SHARDS))
    accounts = range(2, 60_002)
    cornered = sum(set(account_shards(a, name, DEFAULT_SHARDS)) <= flooder for a in accounts)
    expected = len(accounts) / sharding.collision_odds(DEFAULT_SHARDS)
    assert 0.8 * expected < cornered < 1.2 * expected


def test_shards_apart_avoid_the_others_and_are_deterministic() -> None:
    avoid = [3, 9]
    apart = sharding.shards_apart(avoid, 16, "7/dp-a/b")
    assert len(apart) == SHARDS_PER_ACCOUNT and not set(apart) & set(avoid)
    assert apart == sharding.shards_apart(avoid, 16, "7/dp-a/b")
    assert sharding.shards_apart([0], 3, "x") == [1, 2]  # just enough free


def test_shards_apart_refuse_when_none_is_free() -> None:
    with pytest.raises(ValueError, match="free"):
        sharding.shards_apart([0, 1], 3, "x")
    with pytest.raises(ValueError, match="free"):
        sharding.shards_apart([0], 1, "x")


@pytest.mark.parametrize(
    ("chosen", "message"),
    [
        ([], "at least one"),
        ([1, 1], "at most once"),
        ([16], "not among 0..15"),
        ([-1], "not among"),
    ],
)
def test_a_move_names_distinct_shards_of_the_deployable(chosen: list[int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        sharding.check_shards(chosen, 16)
    assert sharding.check_shards([9, 2], 16) == [2, 9]


def test_a_moved_account_uses_its_move_and_the_others_their_own() -> None:
    target = Target.deployment("acme/sdxl", 16)
    moves = {5: [4, 11]}
    assert sharding.effective_shards(5, target, moves) == [4, 11]
    assert sharding.effective_shards(6, target, moves) == account_shards(6, target.name, 16)
    assert sharding.parse_moved(b"4,11") == [4, 11]
