"""The one asyncio shell around a sans-IO core: events in, effects out, one timer.

A sans-IO core (the lane's, the pool's) is a plain object whose ``handle(event)`` returns the
effects to carry out, in order; it never reads a clock or touches the loop. :class:`Shell` is
what drives it from the event loop, the same way for every core:

* **inbox and re-entrancy guard**: :meth:`Shell.feed` hands an event to the core and carries
  out its effects. An event fed while effects are being carried out (an effect handler that
  answers with news of its own) queues in the inbox and is handled after the current one's
  effects, never re-entrantly: the core is never entered twice at once. asyncio runs one
  callback at a time, so no lock is needed.
* **the one timer**: an effect of the core's timer type (``ArmTimer(at)``) (re)arms the
  shell's single timer, replacing any earlier one; when it fires the core is fed
  ``tick(instant)``: :class:`Tick`, the one timer event every core shares. The loop may fire
  a hair early, so the instant is never before the one asked for: the core sees the time it
  wanted.
* **the clock**: the loop's by default (monotonic seconds, the one every ``now`` and deadline
  of the cores uses); an injected :class:`Clock` (``time`` and ``call_at``, as an asyncio loop
  has) drives the shell without a loop.
* **effects**: every other effect goes to the host's ``carry_out``. One that raises is logged
  with its traceback and the effects and events after it are still carried out: a broken
  handler must not strand the grants and timers queued behind it. An exception from the core
  itself propagates to the feeder; the guard is released and events still queued are handled
  at the next feed.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

log = logging.getLogger(__name__)

E = TypeVar("E")
F = TypeVar("F")


@dataclass(frozen=True, slots=True)
class Tick:
    """The event every core's timer sends: the timer armed by the core's last timer effect
    fired at ``now``, on the core's clock (a late or spurious one is harmless)."""

    now: float


@dataclass(frozen=True, slots=True)
class ArmTimer:
    """The effect every core uses for its one timer: (re)arm it to send :class:`Tick` at
    ``at``, on the core's clock. Replaces any earlier one."""

    at: float


class TimerHandle(Protocol):
    def cancel(self) -> None: ...


class Clock(Protocol):
    """What the shell needs of time: ``asyncio.AbstractEventLoop`` is one."""

    def time(self) -> float: ...

    def call_at(self, when: float, callback: Callable[[], object], /) -> TimerHandle: ...


class TimerRequest(Protocol):
    """The core's effect that asks for its one timer: fire ``tick`` at ``at``."""

    @property
    def at(self) -> float: ...


class Shell(Generic[E, F]):
    def __init__(
        self,
        handle: Callable[[E], Iterable[F]],
        carry_out: Callable[[F], None],
        *,
        timer: type[TimerRequest],
        tick: Callable[[float], E],
        clock: Clock | None = None,
    ) -> None:
        """``handle``: the core's; ``carry_out``: the host's, for every effect but a
        ``timer``; ``tick(now)``: the event the timer feeds; ``clock``: the running loop's
        when None (looked up at each use, so the shell may be built outside the loop)."""
        self._handle = handle
        self._carry_out = carry_out
        self._timer_type = timer
        self._tick_event = tick
        self._clock = clock
        self._inbox: deque[E] = deque()
        self._feeding = False
        self._timer: TimerHandle | None = None

    @property
    def clock(self) -> Clock:
        return self._clock if self._clock is not None else asyncio.get_running_loop()

    def now(self) -> float:
        return self.clock.time()

    def feed(self, event: E) -> None:
        """Give ``event`` to the core and carry out its effects; while effects are being carried
        out, only queue it (it is handled after them)."""
        self._inbox.append(event)
        if self._feeding:
            return
        self._feeding = True
        try:
            while self._inbox:
                for effect in self._handle(self._inbox.popleft()):
                    if isinstance(effect, self._timer_type):
                        self._arm(effect.at)
                    else:
                        self._carry(effect)
        finally:
            self._feeding = False

    def _carry(self, effect: F) -> None:
        try:
            self._carry_out(effect)
        except Exception:
            log.exception("carrying out %r failed", effect)

    def _arm(self, at: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self.clock.call_at(at, lambda: self._fire(at))

    def _fire(self, at: float) -> None:
        self._timer = None
        self.feed(self._tick_event(max(self.now(), at)))

    def close(self) -> None:
        """Cancel the armed timer (the host is going away)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
