"""The one sans-IO shell (:mod:`core.shell`) on a toy core and an injected clock: the core is
never entered twice at once, the one timer fires in order at the instant it asked for, and a
failing effect handler strands nothing behind it."""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from core.shell import Shell, Tick


@dataclass(frozen=True)
class Note:
    """An event of the toy core: ``say`` each of ``effects`` back (``arm:<t>`` asks for the
    timer at ``t``)."""

    name: str
    effects: tuple[str, ...] = ()


@dataclass(frozen=True)
class ArmTimer:
    at: float


@dataclass(frozen=True)
class Say:
    what: str


Event = Note | Tick
Effect = Say | ArmTimer


class ToyCore:
    """Records what it handles and how deeply it was entered."""

    def __init__(self) -> None:
        self.handled: list[Event] = []
        self.depth = 0
        self.deepest = 0

    def handle(self, event: Event) -> list[Effect]:
        self.depth += 1
        self.deepest = max(self.deepest, self.depth)
        try:
            self.handled.append(event)
            if isinstance(event, Tick):
                return [Say(f"tick@{event.now:g}")]
            if event.name == "crash":
                raise RuntimeError("the core broke")
            return [
                ArmTimer(float(e.removeprefix("arm:"))) if e.startswith("arm:") else Say(e)
                for e in event.effects
            ]
        finally:
            self.depth -= 1


@dataclass
class _Handle:
    cancelled: bool = False

    def cancel(self) -> None:
        self.cancelled = True


@dataclass
class ManualClock:
    """A clock moved by hand; ``early`` fires each timer that much before its instant, as a
    loop may."""

    now: float = 0.0
    early: float = 0.0
    _due: list[tuple[float, int, Callable[[], object], _Handle]] = field(default_factory=list)
    _order: itertools.count[int] = field(default_factory=itertools.count)

    def time(self) -> float:
        return self.now

    def call_at(self, when: float, callback: Callable[[], object], /) -> _Handle:
        handle = _Handle()
        heapq.heappush(self._due, (when, next(self._order), callback, handle))
        return handle

    @property
    def armed(self) -> int:
        return sum(not handle.cancelled for *_, handle in self._due)

    def advance(self, to: float) -> None:
        while self._due and self._due[0][0] - self.early <= to:
            when, _, callback, handle = heapq.heappop(self._due)
            if not handle.cancelled:
                self.now = max(self.now, when - self.early)
                callback()
        self.now = to


def _shell(
    carry_out: Callable[[Effect], None], clock: ManualClock | None = None
) -> tuple[ToyCore, Shell[Event, Effect]]:
    core = ToyCore()
    shell: Shell[Event, Effect] = Shell(
        core.handle, carry_out, timer=ArmTimer, tick=Tick, clock=clock or ManualClock()
    )
    return core, shell


def test_an_event_fed_by_an_effect_queues_behind_the_current_effects() -> None:
    done: list[str] = []

    def carry_out(effect: Effect) -> None:
        assert isinstance(effect, Say)
        done.append(effect.what)
        if effect.what == "grant":  # nobody waits for it: handed straight back
            shell.feed(Note("given back", ("released",)))

    core, shell = _shell(carry_out)
    shell.feed(Note("request", ("grant", "after grant")))
    assert core.deepest == 1
    assert [e.name for e in core.handled if isinstance(e, Note)] == ["request", "given back"]
    assert done == ["grant", "after grant", "released"]


def test_the_one_timer_fires_in_order_at_the_instant_asked_and_is_replaced() -> None:
    said: list[str] = []
    clock = ManualClock()
    core, shell = _shell(lambda e: said.append(e.what) if isinstance(e, Say) else None, clock)
    shell.feed(Note("first", ("arm:5",)))
    shell.feed(Note("sooner", ("arm:2",)))  # replaces the timer at 5
    assert clock.armed == 1
    clock.advance(1.9)
    assert said == []
    clock.advance(10.0)
    assert said == ["tick@2"]
    shell.feed(Note("again", ("arm:12", "x")))
    clock.advance(11.0)
    shell.feed(Note("later", ("arm:15",)))
    clock.advance(20.0)
    assert said == ["tick@2", "x", "tick@15"]
    assert core.deepest == 1


def test_an_early_timer_still_ticks_at_the_instant_asked() -> None:
    clock = ManualClock(early=0.001)
    core, shell = _shell(lambda e: None, clock)
    shell.feed(Note("arm", ("arm:3",)))
    clock.advance(2.9995)  # the clock fires 1 ms early
    assert Tick(3.0) in core.handled


def test_close_cancels_the_timer() -> None:
    clock = ManualClock()
    core, shell = _shell(lambda e: None, clock)
    shell.feed(Note("arm", ("arm:1",)))
    shell.close()
    clock.advance(5.0)
    assert not any(isinstance(e, Tick) for e in core.handled)


def test_a_failing_effect_handler_does_not_wedge_the_inbox(
    caplog: pytest.LogCaptureFixture,
) -> None:
    done: list[str] = []

    def carry_out(effect: Effect) -> None:
        assert isinstance(effect, Say)
        if effect.what == "boom":
            shell.feed(Note("queued by the failing one", ("queued",)))
            raise ValueError("the handler broke")
        done.append(effect.what)

    clock = ManualClock()
    core, shell = _shell(carry_out, clock)
    with caplog.at_level(logging.ERROR, logger="core.shell"):
        shell.feed(Note("one", ("boom", "after boom", "arm:1")))
    assert done == ["after boom", "queued"]  # the effects and events behind it went on
    assert "the handler broke" in caplog.text
    clock.advance(1.0)
    assert done[-1] == "tick@1"
    shell.feed(Note("two", ("fine",)))
    assert done[-1] == "fine"


def test_a_failing_core_reaches_the_feeder_and_the_next_feed_goes_on() -> None:
    done: list[str] = []

    def carry_out(effect: Effect) -> None:
        assert isinstance(effect, Say)
        done.append(effect.what)
        if effect.what == "first":
            shell.feed(Note("crash"))
            shell.feed(Note("behind the crash", ("survivor",)))

    core, shell = _shell(carry_out)
    with pytest.raises(RuntimeError, match="the core broke"):
        shell.feed(Note("start", ("first",)))
    shell.feed(Note("next", ("next",)))
    assert done == ["first", "survivor", "next"]
    assert core.deepest == 1


async def test_without_a_clock_the_shell_runs_on_the_loop() -> None:
    loop = asyncio.get_running_loop()
    ticked = asyncio.Event()
    core = ToyCore()

    def carry_out(effect: Effect) -> None:
        if isinstance(effect, Say) and effect.what.startswith("tick@"):
            ticked.set()

    shell: Shell[Event, Effect] = Shell(core.handle, carry_out, timer=ArmTimer, tick=Tick)
    at = loop.time() + 0.01
    shell.feed(Note("arm", (f"arm:{at!r}",)))
    await asyncio.wait_for(ticked.wait(), 10)
    (tick,) = [e for e in core.handled if isinstance(e, Tick)]
    assert tick.now >= at
    shell.close()
