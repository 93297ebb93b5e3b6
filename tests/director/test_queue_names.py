"""Stream names and shuffle sharding (pure logic)."""

from __future__ import annotations

from collections import Counter

from director.queue import deployment_stream, version_stream
from tracker.keys import Target, account_shards


def test_stream_names_follow_the_documented_layout() -> None:
    assert deployment_stream("acme/sdxl", 3) == "input:prediction:{dp-acme/sdxl}:3"
    assert version_stream("ab" * 32, 0) == f"input:prediction:{{vp-{'ab' * 32}}}:0"
    target = Target("dp", "acme/sdxl", 8)
    assert target.name == "dp-acme/sdxl"
    assert target.all_streams() == [deployment_stream("acme/sdxl", s) for s in range(8)]
    assert target.reconcile_lock == "lock:reconcile:{dp-acme/sdxl}"


def test_a_target_owns_its_shards_under_any_shard_count() -> None:
    target = Target("dp", "acme/sdxl", 2)
    assert all(target.owns(stream) for stream in target.all_streams())
    assert target.owns(Target("dp", "acme/sdxl", 16).stream(15))  # another shard count
    assert not target.owns(Target("dp", "acme/sdxl2", 2).stream(0))
    assert not target.owns(Target("vp", "acme/sdxl", 2).stream(0))
    assert not target.owns("dead:{dp-acme/sdxl}:0")


def test_streams_for_an_account_are_its_shards() -> None:
    target = Target("vp", "ab" * 32, 8)
    shards = account_shards(5, target.name, 8)
    assert target.streams_for(5) == [target.stream(s) for s in shards]


def test_each_account_maps_to_two_stable_distinct_shards() -> None:
    for account in range(200):
        shards = account_shards(account, "dp-acme/sdxl", 8)
        assert len(set(shards)) == 2
        assert all(0 <= s < 8 for s in shards)
        assert shards == account_shards(account, "dp-acme/sdxl", 8)


def test_shards_spread_accounts_evenly() -> None:
    load = Counter(s for a in range(4000) for s in account_shards(a, "dp-x/y", 8))
    assert len(load) == 8
    assert max(load.values()) < 1.2 * min(load.values())


def test_mapping_differs_per_deployable() -> None:
    same = sum(
        account_shards(a, "dp-a/one", 8) == account_shards(a, "dp-a/two", 8) for a in range(500)
    )
    assert same < 50  # ~1/28 of pairs coincide by chance


def test_fewer_shards_than_k() -> None:
    assert account_shards(7, "dp-x/y", 1) == [0]
