"""The read order of a director serving several deployments on one pool host: loaded models
first, an aging bound past which a deployment is read first regardless (tables, and Hypothesis
properties over random queues and over a simulated run of read cycles)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from director.preference import AGED, COLD, IDLE, READY, Waiting, read_order, tier

BOUND = 10.0


def _w(ready: bool, oldest: float | None, backlog: int = 1) -> Waiting:
    return Waiting(ready, oldest, backlog if oldest is not None else 0)


@pytest.mark.parametrize(
    ("queues", "expected"),
    [
        # A loaded model goes first although the cold one's entry is older.
        ([_w(False, 5.0), _w(True, 1.0)], [1, 0]),
        # Past the bound the cold one goes first, loaded or not.
        ([_w(True, 1.0), _w(False, 10.5)], [1, 0]),
        # Exactly at the bound it has not passed it yet.
        ([_w(True, 1.0), _w(False, 10.0)], [0, 1]),
        # Several aged: oldest first, whatever their models.
        ([_w(True, 11.0), _w(False, 30.0), _w(False, 12.0)], [1, 2, 0]),
        # Among loaded ones, and among cold ones, oldest first.
        ([_w(True, 1.0), _w(True, 3.0), _w(False, 4.0), _w(False, 9.0)], [1, 0, 3, 2]),
        # Nothing waits: last, in the order given (still read: entries may have come since).
        ([_w(True, None), _w(False, 2.0), _w(False, None)], [1, 0, 2]),
        # Nothing known at all: the order given.
        ([_w(False, None), _w(False, None)], [0, 1]),
        # A backlog whose oldest is not known yet counts as just arrived.
        ([Waiting(False, None, 3), Waiting(True, None, 1)], [1, 0]),
        # Ties keep the order given.
        ([_w(True, 2.0), _w(True, 2.0)], [0, 1]),
        ([_w(True, 2.0)], [0]),
        ([], []),
    ],
)
def test_read_order_table(queues: list[Waiting], expected: list[int]) -> None:
    assert read_order(queues, BOUND) == expected


@pytest.mark.parametrize(
    ("queue", "expected"),
    [
        (_w(True, 1.0), READY),
        (_w(False, 1.0), COLD),
        (_w(True, 10.1), AGED),
        (_w(False, 10.1), AGED),
        (_w(True, None), IDLE),
        (Waiting(False, 99.0, 0), IDLE),  # the age of nothing does not count
    ],
)
def test_tiers(queue: Waiting, expected: int) -> None:
    assert tier(queue, BOUND) == expected


waitings = st.builds(
    Waiting,
    ready=st.booleans(),
    oldest_wait=st.none() | st.floats(min_value=0, max_value=100, allow_nan=False),
    backlog=st.integers(min_value=0, max_value=5),
)


@given(st.lists(waitings, max_size=8), st.floats(min_value=0, max_value=50))
def test_order_is_aged_then_ready_then_cold_each_oldest_first(
    queues: list[Waiting], bound: float
) -> None:
    order = read_order(queues, bound)
    assert sorted(order) == list(range(len(queues)))  # every deployment, once
    tiers = [tier(queues[i], bound) for i in order]
    assert tiers == sorted(tiers)
    for before, after in zip(order, order[1:], strict=False):
        a, b = queues[before], queues[after]
        if tier(a, bound) == tier(b, bound) != IDLE:
            assert (a.oldest_wait or 0.0) >= (b.oldest_wait or 0.0)
    if AGED not in tiers:  # READY ones first otherwise
        ready = [k for k, t in enumerate(tiers) if t == READY]
        cold = [k for k, t in enumerate(tiers) if t == COLD]
        assert not ready or not cold or max(ready) < min(cold)


@dataclass
class _Deployment:
    ready: bool
    arrivals: list[float] = field(default_factory=list)  # times its waiting entries came

    def waiting(self, now: float) -> Waiting:
        oldest = now - self.arrivals[0] if self.arrivals else None
        return Waiting(self.ready, oldest, len(self.arrivals))


def _cycle(deployments: list[_Deployment], now: float, bound: float, capacity: int) -> list[int]:
    """One read cycle as the director reads (``Queue.read_in_turn``): up to ``capacity``
    entries, oldest first within a deployment, deployments in the order picked. Returns how
    many each gave."""
    order = read_order([d.waiting(now) for d in deployments], bound)
    taken = [0] * len(deployments)
    for index in order:
        room = capacity - sum(taken)
        take = min(room, len(deployments[index].arrivals))
        del deployments[index].arrivals[:take]
        taken[index] = take
    return taken


@settings(max_examples=200, deadline=None)
@given(
    ready=st.lists(st.booleans(), min_size=2, max_size=4),
    arrivals=st.lists(st.lists(st.integers(0, 2), min_size=4, max_size=4), max_size=40),
    capacity=st.integers(1, 3),
    bound=st.integers(0, 6),
)
def test_the_oldest_entry_past_the_bound_is_read_within_one_cycle(
    ready: list[bool], arrivals: list[list[int]], capacity: int, bound: int
) -> None:
    """Whatever the load: once the oldest waiting entry of all has waited past the bound,
    the next read cycle reads it (so no entry waits past the bound for longer than the entries
    older than it take to read); and with nothing past the bound, no cold deployment is read
    while a loaded one still has entries left."""
    deployments = [_Deployment(r) for r in ready]
    for now, came in enumerate(arrivals):
        for d, count in zip(deployments, came, strict=False):
            d.arrivals += [float(now)] * count
        waits = [d.waiting(now) for d in deployments]
        holders = [i for i, w in enumerate(waits) if w.backlog]
        oldest = max(holders, key=lambda i: waits[i].oldest_wait or 0.0, default=None)
        aged = [i for i in holders if tier(waits[i], bound) == AGED]
        taken = _cycle(deployments, now, bound, capacity)
        if oldest is not None and tier(waits[oldest], bound) == AGED:
            assert taken[oldest] > 0
        if not aged:
            left_ready = [i for i in holders if waits[i].ready and deployments[i].arrivals]
            read_cold = [i for i in holders if not waits[i].ready and taken[i]]
            assert not (left_ready and read_cold)


def test_a_cold_model_is_read_once_past_the_bound_while_a_loaded_one_is_flooded() -> None:
    """A loaded model with more fresh entries each cycle than the director reads, beside a
    model that is not loaded: the cold one's entry waits the bound and one cycle, no more."""
    flooded, cold = _Deployment(ready=True), _Deployment(ready=False, arrivals=[0.0])
    read_at = None
    for now in range(30):
        flooded.arrivals = [float(now)] * 5  # fresh every cycle (older ones read elsewhere)
        taken = _cycle([flooded, cold], float(now), BOUND, capacity=2)
        if taken[1]:
            read_at = now
            break
        assert taken == [2, 0]
    assert read_at == BOUND + 1
