"""The lane's sans-IO core, driven with plain clock values: one table test per rule, then
Hypothesis properties over random event sequences, fairness and an overload/thrash table."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.shell import ArmTimer, Tick
from lane import (
    Arrive,
    Cancel,
    Dispatch,
    Done,
    Effect,
    Event,
    Fail,
    LaneConfig,
    LaneCore,
    Outcome,
    Reject,
    RejectReason,
    RunnersChanged,
    RunnerSlot,
)
from lane.events import Repay
from lane.runners import Health
from tracker.waiter_shares import account_cap

OOC = RejectReason.OUT_OF_CAPACITY


def lane(**config: object) -> LaneCore:
    return LaneCore(LaneConfig(**config), random.Random(7))  # type: ignore[arg-type]


def runners(
    core: LaneCore, *slots: tuple[str, int], dep: str = "d", now: float = 0.0
) -> list[Effect]:
    return core.handle(RunnersChanged(dep, tuple(RunnerSlot(r, p) for r, p in slots), now))


def arrive(
    core: LaneCore,
    request_id: str,
    *,
    account: str = "a",
    band: int = 1,
    deadline: float | None = None,
    now: float = 0.0,
    dep: str = "d",
) -> list[Effect]:
    return core.handle(Arrive(request_id, dep, account, band, deadline, now))


def done(
    core: LaneCore,
    request_id: str,
    runner_id: str,
    outcome: Outcome = Outcome.OK,
    *,
    now: float = 1.0,
    first_byte: bool = False,
    retry_after: float | None = None,
) -> list[Effect]:
    return core.handle(Done(request_id, runner_id, outcome, first_byte, now, retry_after))


def dispatches(effects: list[Effect]) -> list[tuple[str, str, int]]:
    return [(e.request_id, e.runner_id, e.attempt) for e in effects if isinstance(e, Dispatch)]


def rejects(effects: list[Effect]) -> list[tuple[str, RejectReason]]:
    return [(e.request_id, e.reason) for e in effects if isinstance(e, Reject)]


def timers(effects: list[Effect]) -> list[float]:
    return [e.at for e in effects if isinstance(e, ArmTimer)]


# --- admission ----------------------------------------------------------------------------------


def test_a_free_permit_dispatches_at_once_and_the_rest_queue() -> None:
    core = lane()
    runners(core, ("r1", 2))
    assert arrive(core, "x") == [Dispatch("x", "r1", 1, 0.0)]
    assert dispatches(arrive(core, "y")) == [("y", "r1", 1)]
    queued = arrive(core, "z", now=2.0)
    assert queued == [ArmTimer(32.0)]
    assert core.snapshot()["d"].queue_depth == 1
    # The moment a permit frees, the queued request gets it, with its wait.
    assert done(core, "x", "r1", now=3.5) == [Dispatch("z", "r1", 1, 1.5)]


def shared(core: LaneCore, runner: str, permits: int, now: float = 0.0) -> list[Effect]:
    """A runner whose ``permits`` are all shared (fewer than replicas): none of its own here."""
    return core.handle(RunnersChanged("d", (RunnerSlot(runner, 0, permits),), now))


def test_a_replica_with_no_slice_borrows_a_shared_permit_and_gives_it_back_when_idle() -> None:
    core = lane()
    shared(core, "r", 1)
    assert core.refuse_early("d", "a", 1, 0.0) is None  # it may borrow: not refused early
    assert core.borrowable("d", 0.0) == [("r", 1)]
    # Borrowed (Redis counted it): the request runs on it at once.
    assert core.handle(Arrive("x", "d", "a", 1, None, 0.0, loan="r")) == [
        Dispatch("x", "r", 1, 0.0)
    ]
    assert core.borrowable("d", 0.5) == []  # all of its shared permits are held here
    # A second request waits behind it on the borrowed permit, which is kept while used.
    arrive(core, "y", now=0.5)
    assert done(core, "x", "r", now=1.0) == [Dispatch("y", "r", 1, 0.5)]
    # Idle: given back at once, and the next request must borrow again.
    assert done(core, "y", "r", now=2.0) == [Repay("d", "r")]
    assert core.snapshot()["d"].permits_free == 0
    assert core.borrowable("d", 2.0) == [("r", 1)]
    # Nothing borrowed (another replica holds it): refused at once, as capacity.
    assert rejects(arrive(core, "z", now=2.0)) == [("z", OOC)]


def test_a_permit_borrowed_on_a_runner_gone_goes_straight_back() -> None:
    core = lane()
    shared(core, "r", 1)
    runners(core)  # the runner left between the borrow and the arrival
    effects = core.handle(Arrive("x", "d", "a", 1, None, 0.0, loan="r"))
    assert Repay("d", "r") in effects
    assert rejects(effects) == [("x", RejectReason.NO_RUNNER)]


def test_a_runner_that_leaves_gives_back_its_borrowed_permit_after_its_last_request() -> None:
    core = lane()
    shared(core, "r", 2)
    core.handle(Arrive("x", "d", "a", 1, None, 0.0, loan="r"))
    assert Repay("d", "r") not in runners(core, now=0.5)  # still running there
    assert done(core, "x", "r", now=1.0) == [Repay("d", "r")]


def test_a_replica_with_its_own_free_permit_borrows_nothing() -> None:
    core = lane()
    runners(core, ("own", 1))
    core.handle(RunnersChanged("d", (RunnerSlot("own", 1), RunnerSlot("r", 0, 1)), 0.0))
    assert core.borrowable("d", 0.0) == []
    arrive(core, "x")
    assert core.borrowable("d", 0.0) == [("r", 1)]


@pytest.mark.parametrize(
    ("slots", "reason", "retry_after"),
    [
        (None, RejectReason.NO_RUNNER, 5),  # deployment never seen
        ((), RejectReason.NO_RUNNER, 5),  # listed with no runner
        ((("r1", 0),), OOC, 1),  # runners, but no share of them on this replica: no queue
    ],
)
def test_no_runner_or_no_share(
    slots: tuple[tuple[str, int], ...] | None, reason: RejectReason, retry_after: int
) -> None:
    core = lane()
    if slots is not None:
        runners(core, *slots)
    assert arrive(core, "x") == [Reject("x", reason, retry_after)]


def test_queue_bound_and_one_account_at_most_half_of_it() -> None:
    core = lane(queue_factor=4)  # 1 permit: 4 places, 2 per account
    runners(core, ("r1", 1))
    arrive(core, "a0")
    assert arrive(core, "a1") == [ArmTimer(30.0)]
    arrive(core, "a2")
    assert rejects(arrive(core, "a3")) == [("a3", OOC)]  # a's half is full
    arrive(core, "b1", account="b")
    arrive(core, "c1", account="c")
    assert rejects(arrive(core, "d1", account="d")) == [("d1", OOC)]  # the queue is full
    counters = core.snapshot()["d"]
    assert counters.queue_depth == 4
    assert counters.rejections_total[OOC] == 2


def test_a_more_urgent_arrival_sheds_the_least_urgent_band_newest_of_heaviest() -> None:
    core = lane(queue_factor=4)
    runners(core, ("r1", 1))
    arrive(core, "run")
    arrive(core, "a1", band=2)
    arrive(core, "a2", band=2)
    arrive(core, "b1", account="b", band=2)
    arrive(core, "c1", account="c", band=1)
    # Full: an equal band is refused, a more urgent one displaces a's newest low request.
    assert rejects(arrive(core, "e1", account="e", band=2)) == [("e1", OOC)]
    assert rejects(arrive(core, "e2", account="e", band=1)) == [("a2", OOC)]
    assert rejects(arrive(core, "h1", account="h", band=0)) == [("b1", OOC)]
    assert rejects(arrive(core, "h2", account="h", band=0)) == [("a1", OOC)]
    # Only less urgent bands are shed: the queue now holds c1, e2, h1, h2.
    assert rejects(arrive(core, "h3", account="i", band=1)) == [("h3", OOC)]
    assert core.snapshot()["d"].queue_depth == 4


def test_dispatch_order_strict_bands_then_round_robin_then_fifo() -> None:
    core = lane()
    runners(core, ("r1", 1))
    arrive(core, "run")
    for request_id, account, band in [
        ("a1", "a", 1),
        ("a2", "a", 1),
        ("a3", "a", 1),
        ("b1", "b", 1),
        ("l1", "c", 2),
        ("h1", "c", 0),
    ]:
        arrive(core, request_id, account=account, band=band)
    order, running, now = [], "run", 1.0
    while True:
        granted = dispatches(done(core, running, "r1", now=now))
        if not granted:
            break
        running = granted[0][0]
        order.append(running)
        now += 1
    assert order == ["h1", "a1", "b1", "a2", "a3", "l1"]


# --- expiry -------------------------------------------------------------------------------------


def test_a_queued_request_expires_by_timer_at_its_ttl_or_deadline() -> None:
    core = lane()
    runners(core, ("r1", 1))
    arrive(core, "run")
    assert timers(arrive(core, "ttl", now=1.0)) == [31.0]
    assert timers(arrive(core, "soon", account="b", deadline=10.0, now=2.0)) == [10.0]
    assert rejects(core.handle(Tick(10.0))) == [("soon", RejectReason.EXPIRED)]
    assert core.armed == 31.0
    # A late timer still expires it (and nothing that has time left).
    assert rejects(arrive(core, "late", account="c", now=40.0)) == [("ttl", RejectReason.EXPIRED)]
    assert core.snapshot()["d"].rejections_total[RejectReason.EXPIRED] == 2


def test_a_deadline_already_past_is_refused_as_expired() -> None:
    core = lane()
    runners(core, ("r1", 1))
    assert rejects(arrive(core, "x", deadline=5.0, now=5.0)) == [("x", RejectReason.EXPIRED)]


# --- cancel -------------------------------------------------------------------------------------


def test_cancel_while_queued_leaves_at_once_and_takes_no_permit() -> None:
    core = lane()
    runners(core, ("r1", 1))
    arrive(core, "run")
    arrive(core, "gone")
    arrive(core, "next", account="b")
    assert core.handle(Cancel("gone", 0.5)) == []
    assert dispatches(done(core, "run", "r1")) == [("next", "r1", 1)]
    assert core.tracked == 1


def test_cancel_while_dispatched_holds_the_permit_until_done_and_never_retries() -> None:
    core = lane()
    runners(core, ("r1", 1), ("r2", 1))
    arrive(core, "x")
    arrive(core, "y")
    arrive(core, "q")
    assert core.handle(Cancel("x", 0.5)) == []
    assert core.snapshot()["d"].permits_used == 2
    # The aborted call fails: no retry, no Fail (nobody listens); the permit goes to "q".
    assert done(core, "x", "r1", Outcome.FAILED) == [Dispatch("q", "r1", 1, 1.0)]
    assert dispatches(done(core, "y", "r2", Outcome.DISCONNECTED)) == []
    assert core.tracked == 1


# --- refusal, retry, budget ---------------------------------------------------------------------


def test_a_refusal_marks_the_runner_full_and_retries_on_another() -> None:
    core = lane()
    runners(core, ("r1", 1), ("r2", 1))
    arrive(core, "x")
    effects = done(core, "x", "r1", Outcome.REFUSED, retry_after=10.0, now=1.0)
    assert effects == [Dispatch("x", "r2", 2, 1.0)]
    assert core.snapshot()["d"].permits_full == 1
    # r1 is skipped until its Retry-After: the arrival queues, and the timer is set for r1.
    assert arrive(core, "y", now=2.0) == [ArmTimer(11.0)]
    assert dispatches(core.handle(Tick(11.0))) == [("y", "r1", 1)]
    assert core.snapshot()["d"].retries_total == 1


def test_a_refresh_clears_a_full_mark() -> None:
    core = lane()
    runners(core, ("r1", 1))
    arrive(core, "x")
    assert rejects(done(core, "x", "r1", Outcome.REFUSED, retry_after=20.0)) == [("x", OOC)]
    arrive(core, "y", now=2.0)  # queued behind the full mark
    assert dispatches(runners(core, ("r1", 1), now=3.0)) == [("y", "r1", 1)]


@pytest.mark.parametrize(
    ("outcome", "first_byte", "expected"),
    [
        (Outcome.FAILED, False, "retry"),
        (Outcome.REFUSED, False, "retry"),
        (Outcome.FAILED, True, Fail("x", "the runner failed after the response started", 1)),
        (Outcome.OK, False, None),
        (Outcome.DISCONNECTED, False, None),
    ],
)
def test_retry_only_before_the_first_byte_and_only_for_failures(
    outcome: Outcome, first_byte: bool, expected: object
) -> None:
    core = lane()
    runners(core, ("r1", 1), ("r2", 1))
    arrive(core, "x")
    effects = done(core, "x", "r1", outcome, first_byte=first_byte)
    if expected == "retry":
        assert dispatches(effects) == [("x", "r2", 2)]
    elif expected is None:
        assert effects == [] and core.tracked == 0
    else:
        assert effects == [expected]


def test_at_most_two_attempts_each_on_a_different_runner() -> None:
    core = lane()
    runners(core, ("r1", 1), ("r2", 1), ("r3", 1))
    arrive(core, "x")
    assert dispatches(done(core, "x", "r1", Outcome.FAILED)) == [("x", "r2", 2)]
    assert done(core, "x", "r2", Outcome.FAILED) == [Fail("x", "the runner call failed", 2)]


def test_a_failure_with_no_other_free_runner_fails_without_retry() -> None:
    core = lane()
    runners(core, ("r1", 2))
    arrive(core, "x")
    assert done(core, "x", "r1", Outcome.FAILED) == [Fail("x", "the runner call failed", 1)]


def test_the_retry_budget_bounds_concurrent_retries() -> None:
    core = lane()  # budget: max(3, 20 % of active)
    runners(core, *[(f"r{i}", 1) for i in range(8)])
    for i in range(4):
        arrive(core, f"x{i}")
    retried = []
    for i in range(4):
        retried += dispatches(done(core, f"x{i}", f"r{i}", Outcome.FAILED))
    assert [request_id for request_id, _, _ in retried] == ["x0", "x1", "x2"]
    counters = core.snapshot()["d"]
    assert counters.retries_total == 3 and counters.retry_budget_exhausted_total == 1


# --- ejection -----------------------------------------------------------------------------------


def fail_on_r1(core: LaneCore, times: int, now: float) -> float:
    """``times`` requests dispatched to r1 (first available) that fail, retried on r2 (ok)."""
    for _ in range(times):
        request_id = f"f{now}"
        assert dispatches(arrive(core, request_id, now=now)) == [(request_id, "r1", 1)]
        assert dispatches(done(core, request_id, "r1", Outcome.FAILED, now=now)) == [
            (request_id, "r2", 2)
        ]
        done(core, request_id, "r2", now=now)
        now += 0.01
    return now


def test_five_failures_eject_for_30s_doubling_on_reejection_capped() -> None:
    core = lane(health=Health(eject_max_s=100.0))
    runners(core, ("r1", 1), ("r2", 1))
    now = fail_on_r1(core, 5, 0.0)
    assert dispatches(arrive(core, "y", now=now)) == [("y", "r2", 1)]
    done(core, "y", "r2", now=now)
    assert dispatches(arrive(core, "z", now=29.0)) == [("z", "r2", 1)]
    done(core, "z", "r2", now=29.0)
    now = fail_on_r1(core, 5, 30.1)  # back after 30 s; five more failures: 60 s
    assert dispatches(arrive(core, "w", now=now + 59.0)) == [("w", "r2", 1)]
    done(core, "w", "r2", now=now + 59.0)
    now = fail_on_r1(core, 5, now + 60.0)  # 120 s, capped at 100 s
    assert dispatches(arrive(core, "v", now=now + 99.0)) == [("v", "r2", 1)]
    done(core, "v", "r2", now=now + 99.0)
    assert dispatches(arrive(core, "u", now=now + 100.0)) == [("u", "r1", 1)]


def test_the_last_runner_is_never_ejected() -> None:
    core = lane()
    runners(core, ("r1", 1))
    for i in range(12):
        assert dispatches(arrive(core, f"x{i}", now=i)) == [(f"x{i}", "r1", 1)]
        assert isinstance(done(core, f"x{i}", "r1", Outcome.FAILED, now=i)[0], Fail)


def test_a_runner_refusing_the_token_is_out_of_service_at_once_even_the_last() -> None:
    """Not the run's failure: the request goes to another runner, or is refused
    ``runner_unavailable`` (no ``Fail``); while every runner is out, arrivals are refused at
    once and nothing queues; the ejection ends and a call tries the runner again."""
    core = lane()
    runners(core, ("r1", 1), ("r2", 1))
    assert dispatches(arrive(core, "x")) == [("x", "r1", 1)]
    moved = done(core, "x", "r1", Outcome.UNAUTHORIZED, now=1.0)
    assert dispatches(moved) == [("x", "r2", 2)]
    assert core.snapshot()["d"].out_of_service == ("r1",)
    assert dispatches(arrive(core, "q", now=1.5)) == []  # r2 busy: it queues
    refused = done(core, "x", "r2", Outcome.UNAUTHORIZED, now=2.0)
    assert not any(isinstance(effect, Fail) for effect in refused)
    assert rejects(refused) == [
        ("x", RejectReason.RUNNER_UNAVAILABLE),
        ("q", RejectReason.RUNNER_UNAVAILABLE),
    ]
    assert all(r.retry_after_s >= 28 for r in refused if isinstance(r, Reject))
    assert core.snapshot()["d"].out_of_service == ("r1", "r2")
    assert rejects(arrive(core, "y", now=3.0)) == [("y", RejectReason.RUNNER_UNAVAILABLE)]
    early = core.refuse_early("d", "a", 1, 3.0)
    assert early is not None and early.reason is RejectReason.RUNNER_UNAVAILABLE
    assert dispatches(arrive(core, "z", now=31.5)) == [("z", "r1", 1)]  # its 30 s are over
    done(core, "z", "r1", now=31.6)
    assert core.snapshot()["d"].out_of_service == ("r2",)  # r1 answered: back in service


# --- endpoint choice ----------------------------------------------------------------------------


def test_small_runners_are_filled_first_available() -> None:
    core = lane()
    runners(core, ("r1", 2), ("r2", 2))
    granted = [dispatches(arrive(core, f"x{i}"))[0][1] for i in range(4)]
    assert granted == ["r1", "r1", "r2", "r2"]


def test_power_of_two_choices_balances_larger_runners() -> None:
    core = lane()
    runners(core, ("r1", 8), ("r2", 8))
    granted = Counter(dispatches(arrive(core, f"x{i}"))[0][1] for i in range(8))
    assert granted == {"r1": 4, "r2": 4}  # with two runners, P2C is least-loaded


# --- fleet changes ------------------------------------------------------------------------------


def test_a_new_runner_drains_the_queue_and_losing_all_rejects_it() -> None:
    core = lane()
    runners(core, ("r1", 1))
    arrive(core, "run")
    arrive(core, "q1")
    arrive(core, "q2", account="b")
    arrive(core, "q3", account="c")
    assert dispatches(runners(core, ("r1", 1), ("r2", 1), now=1.0)) == [("q1", "r2", 1)]
    effects = runners(core, now=2.0)
    assert rejects(effects) == [("q2", RejectReason.NO_RUNNER), ("q3", RejectReason.NO_RUNNER)]
    # The runners that left still get their Done; nothing goes negative.
    done(core, "run", "r1", now=3.0)
    done(core, "q1", "r2", now=3.0)
    assert core.tracked == 0 and core.snapshot()["d"].in_flight == 0


def test_fewer_permits_shed_what_no_longer_fits() -> None:
    core = lane(queue_factor=2)
    runners(core, ("r1", 2))
    for i in range(6):
        arrive(core, f"x{i}", account=f"acct{i}")
    assert core.snapshot()["d"].queue_depth == 4
    effects = runners(core, ("r1", 1), now=1.0)
    assert rejects(effects) == [("x5", OOC), ("x4", OOC)]
    assert core.snapshot()["d"].queue_depth == 2


# --- Retry-After and counters -------------------------------------------------------------------


def test_retry_after_is_queue_ahead_times_service_p50_over_permits_clamped() -> None:
    core = lane(queue_factor=2)
    runners(core, ("r1", 1))
    for i, seconds in enumerate([2.0, 4.0, 6.0]):
        arrive(core, f"s{i}", now=10.0 * i)
        done(core, f"s{i}", "r1", now=10.0 * i + seconds)
    arrive(core, "run", now=100.0)
    arrive(core, "q1", account="a", now=100.0)
    arrive(core, "q2", account="b", now=100.0)
    # Two ahead and itself, p50 4 s, one permit.
    assert arrive(core, "x", account="c", now=100.0) == [Reject("x", OOC, 12)]


def test_counters_snapshot() -> None:
    core = lane()
    runners(core, ("r1", 2), ("r2", 1))
    arrive(core, "x")
    arrive(core, "y")
    done(core, "x", "r1", Outcome.REFUSED, retry_after=5.0)  # retried on r2
    counters = core.snapshot()["d"]
    assert (counters.permits_free, counters.permits_used, counters.permits_full) == (0, 2, 1)
    assert counters.in_flight == 2 and counters.queue_depth == 0 and counters.retries_total == 1


# --- properties ---------------------------------------------------------------------------------


@dataclass
class Driver:
    """Feeds a core like the shell would, keeping its own account of every request, and checks
    the lane's invariants after every event."""

    core: LaneCore
    now: float = 0.0
    timer: float | None = None
    expiry: dict[str, float] = field(default_factory=dict)
    account: dict[str, tuple[str, str]] = field(default_factory=dict)
    """request id → (deployment, account)."""
    running: dict[str, str] = field(default_factory=dict)
    tried: dict[str, list[str]] = field(default_factory=dict)
    cancelled: set[str] = field(default_factory=set)
    ended: dict[str, str] = field(default_factory=dict)
    permits: dict[str, dict[str, int]] = field(default_factory=dict)
    in_flight: Counter[tuple[str, str]] = field(default_factory=Counter)
    """(deployment, runner id) → calls in flight: runners are per deployment in the core."""
    served: int = 0

    def queued(self) -> list[str]:
        return [r for r in self.account if r not in self.ended and r not in self.running]

    def advance(self, to: float) -> None:
        """Time passes; the timer fires if it falls due, as the shell's would."""
        while self.timer is not None and self.timer <= to:
            at, self.timer = self.timer, None
            self.feed(Tick(max(at, self.now)))
        self.now = max(self.now, to)

    def feed(self, event: Event) -> list[Effect]:
        self.now = max(self.now, event.now)
        self._before(event)
        effects = self.core.handle(event)
        for effect in effects:
            self._apply(effect)
        self._after(event, effects)
        self._check()
        return effects

    def _before(self, event: Event) -> None:
        if isinstance(event, Arrive):
            self.account[event.request_id] = (event.deployment, event.account)
            ttl = event.now + self.core.config.queue_ttl_s
            self.expiry[event.request_id] = min(ttl, event.deadline or ttl)
        elif isinstance(event, Cancel) and event.request_id not in self.ended:
            if event.request_id in self.running:
                self.cancelled.add(event.request_id)
            self.ended[event.request_id] = "cancelled"
        elif isinstance(event, RunnersChanged):
            self.permits[event.deployment] = {s.runner_id: s.permits for s in event.runners}
        elif isinstance(event, Done):
            assert self.running.pop(event.request_id) == event.runner_id
            key = (self.account[event.request_id][0], event.runner_id)
            self.in_flight[key] -= 1
            assert self.in_flight[key] >= 0
            if event.outcome in (Outcome.OK, Outcome.DISCONNECTED):
                self.ended.setdefault(event.request_id, str(event.outcome))
                self.served += event.outcome is Outcome.OK

    def _apply(self, effect: Effect) -> None:
        if isinstance(effect, ArmTimer):
            self.timer = effect.at
            return
        request_id = effect.request_id
        assert request_id not in self.ended, f"{request_id} ended twice"
        assert request_id not in self.running
        if isinstance(effect, Dispatch):
            deployment = self.account[request_id][0]
            self.running[request_id] = effect.runner_id
            self.in_flight[deployment, effect.runner_id] += 1
            limit = self.permits[deployment].get(effect.runner_id, 0)
            assert self.in_flight[deployment, effect.runner_id] <= limit, "above its permits"
            tried = self.tried.setdefault(request_id, [])
            assert effect.runner_id not in tried, "retried on the same runner"
            tried.append(effect.runner_id)
            assert effect.attempt == len(tried) <= self.core.config.max_attempts
        else:
            self.ended[request_id] = type(effect).__name__
            if isinstance(effect, Reject):
                assert 1 <= effect.retry_after_s <= 30

    def _after(self, event: Event, effects: list[Effect]) -> None:
        if isinstance(event, Done) and event.request_id not in self.ended:
            # A failed attempt is retried or ended, never dropped.
            assert any(
                getattr(effect, "request_id", None) == event.request_id for effect in effects
            )

    def _check(self) -> None:
        queued = self.queued()
        for request_id in queued:
            assert self.expiry[request_id] > self.now, "queued past its expiry"
            assert self.timer is not None and self.timer <= self.expiry[request_id]
        snapshot = self.core.snapshot()
        for deployment, counters in snapshot.items():
            mine = [r for r in queued if self.account[r][0] == deployment]
            assert counters.queue_depth == len(mine)
            assert counters.in_flight == sum(
                1 for r in self.running if self.account[r][0] == deployment
            )
            assert counters.retrying == sum(
                1
                for r in self.running
                if self.account[r][0] == deployment and len(self.tried[r]) > 1
            )
            max_queue = self.core.config.queue_factor * sum(self.permits[deployment].values())
            assert len(mine) <= max_queue
            per_account = Counter(self.account[r][1] for r in mine)
            assert all(n <= account_cap(max_queue) for n in per_account.values())
            assert counters.queue_depth == 0 or counters.permits_free == 0, "permit left idle"
        assert self.core.tracked == len(self.queued()) + sum(
            1 for r in self.running if r not in self.cancelled
        ) + sum(1 for r in self.running if r in self.cancelled)

    def finish(self) -> None:
        """Complete everything in flight and let every queue drain or expire."""
        while self.running or self.queued():
            for request_id, runner_id in list(self.running.items()):
                self.feed(Done(request_id, runner_id, Outcome.OK, False, self.now))
            self.advance(self.now + 1.0)
        assert set(self.ended) == set(self.account), "every request ends"
        assert self.core.tracked == 0
        assert all(n == 0 for n in self.in_flight.values())
        assert all(c.in_flight == 0 for c in self.core.snapshot().values())


DEPLOYMENTS = ("d1", "d2")
RUNNERS = ("r1", "r2", "r3")

_arrive = st.tuples(
    st.just("arrive"),
    st.sampled_from(DEPLOYMENTS),
    st.sampled_from(("a", "b", "c")),
    st.integers(0, 2),
    st.none() | st.floats(0, 40),
)
_done = st.tuples(
    st.just("done"),
    st.integers(0, 50),
    st.sampled_from(list(Outcome)),
    st.booleans(),
    st.none() | st.floats(0, 20),
)
_runners = st.tuples(
    st.just("runners"),
    st.sampled_from(DEPLOYMENTS),
    st.lists(st.tuples(st.sampled_from(RUNNERS), st.integers(0, 3)), max_size=3),
)
steps = st.lists(
    # Weighted towards arrivals and completions, so queues fill and drain.
    st.one_of(
        _arrive,
        _arrive,
        _arrive,
        _done,
        _done,
        st.tuples(st.just("cancel"), st.integers(0, 200)),
        st.tuples(st.just("wait"), st.floats(0, 15)),
        _runners,
    ),
    min_size=30,
    max_size=150,
)


def run_steps(driver: Driver, plan: list[tuple[object, ...]]) -> None:
    for n, step in enumerate(plan):
        kind, now = step[0], driver.now
        if kind == "arrive":
            _, deployment, account, band, deadline = step
            assert isinstance(deployment, str) and isinstance(account, str)
            assert isinstance(band, int)
            absolute = None if deadline is None else now + float(deadline)  # type: ignore[arg-type]
            driver.feed(Arrive(f"q{n}", deployment, account, band, absolute, now))
        elif kind == "done" and driver.running:
            _, pick, outcome, first_byte, retry_after = step
            assert isinstance(pick, int) and isinstance(outcome, Outcome)
            request_id = sorted(driver.running)[pick % len(driver.running)]
            refused = outcome is Outcome.REFUSED
            driver.feed(
                Done(
                    request_id,
                    driver.running[request_id],
                    outcome,
                    bool(first_byte) and not refused,
                    now,
                    retry_after,  # type: ignore[arg-type]
                )
            )
        elif kind == "cancel" and driver.account:
            pick = step[1]
            assert isinstance(pick, int)
            driver.feed(Cancel(sorted(driver.account)[pick % len(driver.account)], now))
        elif kind == "wait":
            driver.advance(now + float(step[1]))  # type: ignore[arg-type]
        elif kind == "runners":
            _, deployment, slots = step
            assert isinstance(deployment, str) and isinstance(slots, list)
            driver.feed(RunnersChanged(deployment, tuple(RunnerSlot(*s) for s in slots), now))


@settings(max_examples=300, deadline=None)
@given(plan=steps, seed=st.integers(0, 2**16), factor=st.integers(1, 4))
def test_random_event_sequences_keep_every_invariant(
    plan: list[tuple[object, ...]], seed: int, factor: int
) -> None:
    core = LaneCore(LaneConfig(queue_factor=factor), random.Random(seed))
    driver = Driver(core)
    for deployment in DEPLOYMENTS:
        driver.feed(RunnersChanged(deployment, (RunnerSlot("r1", 1), RunnerSlot("r2", 2)), 0.0))
    run_steps(driver, plan)
    driver.finish()


# --- fairness and overload ----------------------------------------------------------------------


@pytest.mark.parametrize("heavy_backlog", [5, 40, 200])
def test_a_light_account_is_served_within_one_turn_of_a_heavy_one(heavy_backlog: int) -> None:
    core = lane(queue_factor=1000)
    runners(core, ("r1", 1))
    arrive(core, "run", account="heavy")
    for i in range(heavy_backlog):
        arrive(core, f"h{i}", account="heavy")
    arrive(core, "light", account="light")
    order, running, now = [], "run", 1.0
    while "light" not in order:
        running = dispatches(done(core, running, "r1", now=now))[0][0]
        order.append(running)
        now += 1.0
    assert len(order) <= 2  # k = number of accounts in the band


@pytest.mark.parametrize(
    ("load", "flapping", "min_goodput"),
    [
        (1.0, False, 0.9),
        (3.0, False, 0.9),
        (10.0, False, 0.9),
        (3.0, True, 0.6),  # a runner that leaves and comes back every 2 s: half the time gone
    ],
)
def test_overload_keeps_goodput_and_rejects_cheaply(
    load: float, flapping: bool, min_goodput: float
) -> None:
    """4 permits of 1 s calls for 20 s at ``load`` × capacity: permits stay busy, the excess is
    refused with a hint, the queue stays within its bound and every request ends."""
    core = lane()
    driver = Driver(core)
    steady = (RunnerSlot("r1", 2), RunnerSlot("r2", 2))
    driver.feed(RunnersChanged("d", steady, 0.0))
    started: dict[str, float] = {}
    arrivals, credit, step, t = 0, 0.0, 0.05, 0.0
    while t < 20.0:
        t = round(t + step, 6)
        driver.advance(t)
        if flapping and round(t * 20) % 40 == 0:
            slots = steady if round(t) % 4 == 0 else (RunnerSlot("r1", 2),)
            driver.feed(RunnersChanged("d", slots, t))
        for request_id, runner_id in list(driver.running.items()):
            started.setdefault(request_id, t - step)
            if t - started[request_id] >= 1.0 - 1e-9:
                driver.feed(Done(request_id, runner_id, Outcome.OK, False, t))
        credit += load * 4 * step
        while credit >= 1.0:
            credit -= 1.0
            driver.feed(Arrive(f"x{arrivals}", "d", f"acct{arrivals % 7}", 1, None, t))
            arrivals += 1
    goodput = driver.served / (4 * 19.0)  # capacity: 4 calls/s, less the last second's
    assert goodput >= min(min_goodput, load * 0.9)
    reasons = Counter(v for v in driver.ended.values())
    if load > 1.5:
        assert reasons["Reject"] > 0
    driver.finish()
