"""Each api replica's slice of every runner's permits (Knative's activator subsetting), and
the permits shared through Redis when there are too few to slice.

Replicas do not coordinate per request: each owns a disjoint share of each runner's advertised
concurrency, recomputed from the membership list when a replica joins or leaves. A runner's
``concurrency`` is split by floor division; the remainder goes one permit each to the
replicas that follow a stable hash of the runner id around the ring, so the remainders of
many small runners spread over the replicas instead of piling on replica 0. Every runner with
at least one permit overall therefore has at least one in some replica, and the slices add up
to exactly its concurrency. While membership is in flux two replicas may briefly over-count;
the runner's refusal corrects that.

A runner with fewer permits than there are replicas is not sliced: some replica would get
none, and its ``/run`` would be refused at once while the runner idles. Its permits are
*shared* instead: every replica holds none of its own and borrows one from the pool in Redis
(:mod:`lane.loans`) when a request finds no free permit, giving it back once idle. The
borrows are counted in Redis, so the replicas together never hold more than the runner's
concurrency; only these runners' requests cost a round trip to Redis.

The shell applies this before ``RunnersChanged`` (whose ``permits`` are already this replica's
share) and re-sends ``RunnersChanged`` for every deployment when membership changes.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable

from lane.events import RunnerSlot


def member_index(members: Iterable[str], me: str) -> tuple[int, int]:
    """(my index, member count) in the sorted membership, which every replica sorts alike."""
    ordered = sorted(set(members) | {me})
    return ordered.index(me), len(ordered)


def shared_permits(concurrency: int, members: int) -> int:
    """The runner's permits borrowed through Redis rather than sliced: all of them when there
    are fewer than replicas, none otherwise."""
    return max(0, concurrency) if concurrency < members else 0


def slice_permits(runner_id: str, concurrency: int, my_index: int, members: int) -> int:
    """This replica's own permits on a runner advertising ``concurrency`` (0 when they are
    shared: :func:`shared_permits`)."""
    if members < 1 or not 0 <= my_index < members:
        raise ValueError(f"index {my_index} is not among {members} members")
    if concurrency <= 0 or shared_permits(concurrency, members):
        return 0
    base, extra = divmod(concurrency, members)
    start = zlib.crc32(runner_id.encode()) % members
    return base + (1 if (my_index - start) % members < extra else 0)


def slice_runners(
    runners: Iterable[tuple[str, int]], my_index: int, members: int
) -> tuple[RunnerSlot, ...]:
    """``(runner id, advertised concurrency)`` pairs → this replica's ``RunnerSlot``s."""
    return tuple(
        RunnerSlot(
            runner_id,
            slice_permits(runner_id, concurrency, my_index, members),
            shared_permits(concurrency, members),
        )
        for runner_id, concurrency in runners
    )
