"""How an attempt ends: the :class:`Outcome` its handling and execution decide, which
:func:`record` writes, called from one place (``AttemptHandler._end``, which also acknowledges
the entry); and what a run's success may still be refused for, a
hook between the runner's succeeded snapshot and that write (a training's: its weights kept,
its new version made)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy.engine import RowMapping

from protocol.timings import RunnerTimes
from tracker.states import Status
from tracker.tracker import AttemptTracker


@dataclass(frozen=True, slots=True)
class Outcome:
    """The terminal state an attempt decided on, and what goes with it (``output`` and
    ``logs`` None: what the attempt already recorded stands)."""

    status: Status
    error: str | None = None
    output: Any = None
    logs: str | None = None
    #: What the runner reported of the run's time, when it ran.
    times: RunnerTimes | None = None


async def record(tracker: AttemptTracker, decided: Outcome) -> RowMapping | None:
    """Write the attempt's terminal state: the row, or None when another attempt or a cancel
    got there first. The only call of ``tracker.finish`` in the director."""
    return await tracker.finish(
        decided.status,
        output=decided.output,
        logs=decided.logs,
        error=decided.error,
        times=decided.times,
    )


class OutputRefused(Exception):
    """A run that succeeded but whose output cannot be taken as it is (its error): it fails."""


#: Turns a successful run's output into what is recorded (a training's: its new version).
SuccessHook = Callable[[Any], Awaitable[Any]]
