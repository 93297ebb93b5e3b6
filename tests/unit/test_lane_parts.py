"""The lane core's parts on their own: replica slices, the fair queue, Retry-After, budget."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lane import RunnerSlot, member_index, slice_permits, slice_runners
from lane.budget import RetryBudget
from lane.estimate import ServiceTime, retry_after
from lane.queue import FairQueue
from lane.slices import shared_permits
from tracker.waiter_shares import account_cap


@given(
    runner_id=st.text(min_size=1, max_size=12),
    concurrency=st.integers(0, 64),
    members=st.integers(1, 9),
)
def test_slices_and_shared_permits_add_up_and_every_replica_may_serve(
    runner_id: str, concurrency: int, members: int
) -> None:
    shares = [slice_permits(runner_id, concurrency, i, members) for i in range(members)]
    shared = shared_permits(concurrency, members)
    # Never more than the runner's concurrency in all: sliced, or shared through Redis.
    assert sum(shares) + shared == concurrency
    assert max(shares) - min(shares) <= 1
    if concurrency:
        # No replica is left without a way to the runner (it borrows when it has no slice).
        assert all(share >= 1 for share in shares) or shared == concurrency


def test_fewer_permits_than_replicas_are_shared_not_sliced() -> None:
    # A concurrency-1 runner behind two replicas: neither owns it, both may borrow it.
    assert slice_runners([("r", 1)], 0, 2) == (RunnerSlot("r", 0, 1),)
    assert slice_runners([("r", 1)], 1, 2) == (RunnerSlot("r", 0, 1),)
    # As many permits as replicas, or more: sliced as before, nothing shared.
    assert slice_runners([("r", 2)], 1, 2) == (RunnerSlot("r", 1, 0),)
    assert [slice_permits("r", 3, i, 2) for i in range(2)] in ([1, 2], [2, 1])


def test_remainders_spread_over_replicas() -> None:
    # 30 four-permit runners over 3 replicas: the remainders do not pile on one replica.
    per_replica = [sum(slice_permits(f"runner-{n}", 4, i, 3) for n in range(30)) for i in range(3)]
    assert sum(per_replica) == 120 and min(per_replica) >= 35


def test_member_index_is_the_same_on_every_replica() -> None:
    members = ["api-c", "api-a", "api-b"]
    assert member_index(members, "api-b") == (1, 3)
    assert member_index([], "api-x") == (0, 1)  # alone before the first heartbeat
    assert slice_runners([("r", 4)], 0, 1) == (RunnerSlot("r", 4),)
    with pytest.raises(ValueError):
        slice_permits("r", 4, 3, 3)


def test_fair_queue_order_and_removal() -> None:
    queue = FairQueue()
    for request_id, account, band in [
        ("a1", "a", 1),
        ("a2", "a", 1),
        ("b1", "b", 1),
        ("low", "b", 2),
        ("high", "c", 0),
    ]:
        queue.push(request_id, account, band)
    assert queue.count("b") == 2 and len(queue) == 5
    assert queue.remove("a2") and not queue.remove("a2")
    assert [queue.pop() for _ in range(5)] == ["high", "a1", "b1", "low", None]
    with pytest.raises(ValueError):
        queue.push("x", "a", 1)
        queue.push("x", "a", 1)


def test_fair_queue_victims() -> None:
    queue = FairQueue()
    for request_id, account, band in [("a1", "a", 2), ("a2", "a", 2), ("b1", "b", 2)]:
        queue.push(request_id, account, band)
    assert queue.victim() == "a2"  # newest of the heaviest, least urgent band
    assert queue.victim(below=2) is None  # never displaces an equal band
    assert queue.newest_of("b") == "b1" and queue.newest_of("z") is None


@pytest.mark.parametrize(("max_queue", "cap"), [(0, 0), (1, 1), (2, 1), (3, 2), (10, 5)])
def test_account_cap_is_half_rounded_up(max_queue: int, cap: int) -> None:
    assert account_cap(max_queue) == cap


@pytest.mark.parametrize(
    ("ahead", "p50", "permits", "seconds"),
    [(0, 1.0, 4, 1), (10, 1.0, 4, 3), (100, 2.0, 4, 30), (5, 0.1, 0, 1), (6, 2.5, 1, 15)],
)
def test_retry_after_clamped_to_1_30(ahead: int, p50: float, permits: int, seconds: int) -> None:
    assert retry_after(ahead, p50, permits) == seconds


def test_service_time_is_a_median_of_recent_calls() -> None:
    service = ServiceTime(default_s=1.5, window=3)
    assert service.p50() == 1.5
    for seconds in (1.0, 100.0, 2.0, 3.0):
        service.add(seconds)
    assert service.p50() == 3.0  # the window dropped 1.0; one slow call does not drag it


def test_retry_budget_floor_and_ratio() -> None:
    budget = RetryBudget(ratio=0.2, minimum=3)
    for _ in range(3):
        assert budget.allows(active=1)
        budget.start()
    assert not budget.allows(active=15)
    assert budget.allows(active=20)
    budget.finish()
    assert budget.allows(active=1)
